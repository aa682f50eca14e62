"""`s2t legacy serve`: the legacy Skill service as it ran before the migration.

TensorFlow loads the SavedModel and serves `skill.Skill/Score` (s2t/wire/skill.proto) itself: the caller streams
its records, the service scores them in fixed-size windows (one call of the serving signature per window) on a pool
of 8 threads, and answers once when the caller closes its side. It is the reference a cutover compares against and
the "before" of the before/after table, so its settings are the legacy platform's, not tuned ones.

Its limits (`LegacyLimits`) keep one caller from holding it: a call lasts at most `call_timeout_s` however slowly
its records come; at most `max_calls` calls are in progress (one more is refused RESOURCE_EXHAUSTED; those beyond
the 8 threads wait for one); a message over `max_message_bytes` is refused by gRPC as it arrives, and a record over
64 KiB within it is answered INVALID_RECORD.
"""
from __future__ import annotations

import math
import os
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import grpc
import numpy as np

from s2t.backends.scoring.decision_policy import Thresholds, decide
from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES, RecordError, parse_record
from s2t.wire import skill_pb2, skill_pb2_grpc
from s2t.wire.skill_call import CallRefused, records_within, windows

LEGACY_WINDOW_SIZE = 128
LEGACY_THREADS = 8
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "number"


@dataclass(frozen=True)
class LegacyLimits:
    call_timeout_s: float = 60.0
    # Twice the threads: a caller that starts its next call as its last one returns is not refused (gRPC counts a
    # call until it is fully done), and at most as many calls wait for a thread as are being scored.
    max_calls: int = 2 * LEGACY_THREADS
    max_records: int = 10_000
    max_message_bytes: int = 4 * DEFAULT_MAX_RECORD_BYTES

    def __post_init__(self):
        if self.call_timeout_s <= 0 or min(self.max_calls, self.max_records, self.max_message_bytes) < 1:
            raise ValueError(f"limits must be positive, got {self}")


@dataclass(frozen=True)
class SignatureInput:
    name: str
    is_string: bool
    rank: int


class SavedModelScorer:
    """The SavedModel's `serving_default`: a window of feature maps -> probabilities, or each bad record's error."""

    def __init__(self, saved_model: Path):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self._tf = tf
        # The loaded object owns the variables the signature reads: keep it alive as long as the signature.
        self._model = tf.saved_model.load(str(saved_model))
        self._signature = self._model.signatures["serving_default"]
        _, spec = self._signature.structured_input_signature
        self.inputs = tuple(SignatureInput(name, s.dtype == tf.string, len(s.shape)) for name, s in sorted(spec.items()))
        if len(self._signature.structured_outputs) != 1:
            raise ValueError(f"{saved_model}: a risk model has one output, "
                             f"this one has {len(self._signature.structured_outputs)}")

    def warm_up(self) -> None:
        """One call before the first caller's: TensorFlow traces and allocates on the first run of a signature."""
        self([{spec.name: "" if spec.is_string else 0.0 for spec in self.inputs}])

    def check(self, features: Mapping[str, object]) -> dict[str, object]:
        """The record's value per signature input, or the RecordError naming the first bad attribute."""
        row = {}
        for spec in self.inputs:
            value = features.get(spec.name)
            field = f"features.{spec.name}"
            if value is None:
                raise RecordError(field, "missing")
            if spec.is_string:
                if not isinstance(value, str):
                    raise RecordError(field, f"expected a string, got {_type_name(value)}")
            else:
                if isinstance(value, (bool, str)):
                    raise RecordError(field, f"expected a number, got {_type_name(value)}")
                number = float(value) if abs(value) < 1e308 else math.inf
                if not math.isfinite(number) or abs(number) > _FLOAT32_MAX:
                    raise RecordError(field, f"not a finite float32 number ({value!r})")
                value = number
            row[spec.name] = value
        return row

    def __call__(self, rows: Sequence[Mapping[str, object]]) -> np.ndarray:
        tf = self._tf
        feeds = {}
        for spec in self.inputs:
            column = [row[spec.name] for row in rows]
            array = np.array(column, dtype=object if spec.is_string else np.float32)
            feeds[spec.name] = tf.constant(array.reshape([-1] + [1] * (spec.rank - 1)),
                                           dtype=tf.string if spec.is_string else tf.float32)
        (output,) = self._signature(**feeds).values()
        return output.numpy().reshape(len(rows))


class LegacySkillService(skill_pb2_grpc.SkillServicer):
    def __init__(self, scorer: SavedModelScorer, thresholds: Thresholds, window_size: int = LEGACY_WINDOW_SIZE,
                 limits: LegacyLimits = LegacyLimits()):
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.scorer = scorer
        self.thresholds = thresholds
        self.window_size = window_size
        self.limits = limits

    def Score(self, request_iterator, context):  # noqa: N802 - the name is the legacy RPC's
        records = records_within(request_iterator, self.limits.call_timeout_s, self.limits.max_records)
        results = []
        count = 0
        try:
            for number, window in enumerate(windows(records, self.window_size)):
                count = number + 1
                results.extend(self.score_window(window, number))
        except CallRefused as refused:
            context.abort(refused.code, refused.details)
        return skill_pb2.SkillBatchResult(results=results, window_size=self.window_size, windows=count)

    def score_window(self, window: Sequence[skill_pb2.SkillRecord], number: int) -> list[skill_pb2.SkillResult]:
        results, rows, scored = [], [], []
        for record in window:
            result = skill_pb2.SkillResult(request_id=record.request_id, sequence_id=record.sequence_id,
                                           window=number)
            try:
                rows.append(self.scorer.check(parse_record(record.SerializeToString()).features))
            except RecordError as err:
                result.status, result.error = skill_pb2.INVALID_RECORD, str(err)
            else:
                scored.append(result)
            results.append(result)
        if rows:
            probabilities = self.scorer(rows)
            decisions = decide(probabilities, self.thresholds)
            for result, probability, decision in zip(scored, probabilities, decisions):
                result.status, result.probability, result.decision = skill_pb2.OK, probability, decision.decode()
        return results


def serve(port: int, saved_model: Path, thresholds: Thresholds, window_size: int = LEGACY_WINDOW_SIZE,
          threads: int = LEGACY_THREADS, host: str = "[::]", limits: LegacyLimits = LegacyLimits()) -> grpc.Server:
    """Started; the caller stops it (`server.stop(grace)`)."""
    scorer = SavedModelScorer(saved_model)
    scorer.warm_up()
    service = LegacySkillService(scorer, thresholds, window_size, limits)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), maximum_concurrent_rpcs=limits.max_calls,
                         options=[("grpc.max_receive_message_length", limits.max_message_bytes)])
    skill_pb2_grpc.add_SkillServicer_to_server(service, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    return server

