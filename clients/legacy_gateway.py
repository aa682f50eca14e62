"""`s2t gateway`: the legacy Skill service (clients/proto/skill.proto) in front of Triton.

Legacy callers stream `SkillRecord`s and get one `SkillBatchResult` when they close their side, as they always
did. The gateway keeps the legacy fixed-size windows: every `window_size` records (and the rest at the end) are
scored as one Triton request on `risk_pipeline` over gRPC, the records travelling as the protobuf bytes they came
in (skill_adapter reads both forms). A bad record is answered INVALID_RECORD with the adapter's message and its
window-mates are scored; a failure of Triton itself fails the call with the matching gRPC status.
"""
from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Iterable, Sequence

import grpc
import numpy as np

from backends.batch_scoring import retrying, score_isolating_bad_records
from backends.errors import INTERNAL, INVALID, UNAVAILABLE, of_kind
from clients.proto import skill_pb2, skill_pb2_grpc

DEFAULT_WINDOW_SIZE = 32
# Triton's gRPC status -> what it means for the legacy caller. Anything not listed is INTERNAL.
_TRITON_STATUS_KIND = {
    "StatusCode.INVALID_ARGUMENT": INVALID,
    "StatusCode.UNAVAILABLE": UNAVAILABLE,
    "StatusCode.DEADLINE_EXCEEDED": UNAVAILABLE,
    "StatusCode.RESOURCE_EXHAUSTED": UNAVAILABLE,
    # The model is not loaded (yet, or while a version is swapped): try again, as for an unreachable server.
    "StatusCode.NOT_FOUND": UNAVAILABLE,
}
_LEGACY_CALL_STATUS = {UNAVAILABLE: grpc.StatusCode.UNAVAILABLE, INTERNAL: grpc.StatusCode.INTERNAL}


def error_kind(triton_status: str | None) -> str:
    return _TRITON_STATUS_KIND.get(triton_status or "", INTERNAL)


def windows(records: Iterable, size: int) -> Iterable[list]:
    """Fixed-size windows in arrival order; the last one holds the rest."""
    window = []
    for record in records:
        window.append(record)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


@dataclass
class TritonScorer:
    """One `score_batch` for backends.batch_scoring: payloads -> (probabilities, decisions), or ServingError."""

    url: str
    model: str = "risk_pipeline"
    timeout_s: float = 30.0

    def __post_init__(self):
        import tritonclient.grpc as grpcclient
        self._grpcclient = grpcclient
        # One client per thread: the gateway serves concurrent calls from its thread pool.
        self._local = threading.local()

    def __call__(self, payloads: Sequence[bytes]):
        from tritonclient.utils import InferenceServerException

        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._grpcclient.InferenceServerClient(self.url)
        tensor = self._grpcclient.InferInput("payload", [len(payloads), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(payloads, dtype=object).reshape(-1, 1))
        try:
            result = client.infer(self.model, [tensor], client_timeout=self.timeout_s)
        except InferenceServerException as err:
            raise of_kind(error_kind(err.status()), err.message() or str(err)) from None
        return result.as_numpy("probability"), result.as_numpy("decision")


class SkillGateway(skill_pb2_grpc.SkillServicer):
    def __init__(self, scorer, window_size: int = DEFAULT_WINDOW_SIZE):
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.scorer = retrying(scorer)
        self.window_size = window_size

    def Score(self, request_iterator, context):  # noqa: N802 - the name is the legacy RPC's
        results = []
        count = 0
        for number, window in enumerate(windows(request_iterator, self.window_size)):
            count = number + 1
            scored = score_isolating_bad_records([r.SerializeToString() for r in window], self.scorer)
            for record, score in zip(window, scored):
                if score.error is not None and score.error.kind != INVALID:
                    context.abort(_LEGACY_CALL_STATUS[score.error.kind],
                                  f"scoring window {number} failed: {score.error.message}")
                results.append(legacy_result(record, score, number))
        return skill_pb2.SkillBatchResult(results=results, window_size=self.window_size, windows=count)


def legacy_result(record: skill_pb2.SkillRecord, score, window: int) -> skill_pb2.SkillResult:
    result = skill_pb2.SkillResult(request_id=record.request_id, sequence_id=record.sequence_id, window=window)
    if score.error is not None:
        result.status = skill_pb2.INVALID_RECORD
        result.error = score.error.message
    else:
        result.status = skill_pb2.OK
        result.probability = score.probability
        result.decision = score.decision.decode()
    return result


def serve(port: int, triton_url: str, model: str = "risk_pipeline", window_size: int = DEFAULT_WINDOW_SIZE,
          workers: int = 8, host: str = "[::]") -> grpc.Server:
    """Started; the caller stops it (`server.stop(grace)`)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    skill_pb2_grpc.add_SkillServicer_to_server(SkillGateway(TritonScorer(triton_url, model), window_size), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    return server
