"""`s2t gateway`: the legacy Skill service (wire/skill.proto) in front of Triton.

Legacy callers stream `SkillRecord`s and get one `SkillBatchResult` when they close their side, as they always
did. The gateway keeps the legacy fixed-size windows: every `window_size` records (and the rest at the end) are
scored as one Triton request on `risk_pipeline` over gRPC, the records travelling as the protobuf bytes they came
in (skill_adapter reads both forms). A bad record is answered INVALID_RECORD with the adapter's message and its
window-mates are scored; a failure of Triton itself fails the call with the matching gRPC status.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import grpc
import numpy as np

from backends.batch_scoring import retrying, score_isolating_bad_records
from backends.errors import INTERNAL, INVALID, UNAVAILABLE, of_kind
from wire import skill_pb2, skill_pb2_grpc
from wire.names import DECISION, PAYLOAD, PROBABILITY

DEFAULT_WINDOW_SIZE = 32
DEFAULT_CONCURRENT_CALLS = 8
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


@dataclass(frozen=True)
class CallLimits:
    timeout_s: float = 60.0
    max_records: int = 10_000
    # gRPC clients refuse a message over 4 MiB unless told otherwise: a longer reply would be scored, then lost.
    max_reply_bytes: int = 4 * 1024 * 1024

    def __post_init__(self):
        if self.timeout_s <= 0 or self.max_records < 1 or self.max_reply_bytes < 1:
            raise ValueError(f"call limits must be positive, got {self}")


class CallRefused(Exception):
    """The call as a whole is refused with `code`; `details` tells the caller why."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


_END = object()


def records_within(request_iterator: Iterator, timeout_s: float, max_records: int,
                   clock=time.monotonic) -> Iterator:
    """The caller's records as they arrive, until it closes its side; CallRefused once `timeout_s` have passed since
    the call began (an idle stream included) or past `max_records`. A reader thread waits on the caller, so the
    handler can give up on a caller that sends nothing; its queue is bounded, so a fast caller is held back by gRPC's
    flow control rather than buffered here."""
    arrivals: queue.Queue = queue.Queue(maxsize=256)
    done = threading.Event()

    def offer(item) -> bool:
        try:
            arrivals.put(item, timeout=0.2)
            return True
        except queue.Full:
            return False

    def read():
        try:
            for record in request_iterator:
                while not offer(record):
                    if done.is_set():
                        return
        except Exception as err:  # noqa: BLE001 - the caller went away, or the call ended: the handler sees why
            offer(err)
            return
        while not offer(_END) and not done.is_set():
            pass

    threading.Thread(target=read, name="skill-call-reader", daemon=True).start()
    end = clock() + timeout_s
    count = 0
    try:
        while True:
            try:
                item = arrivals.get(timeout=max(end - clock(), 0.0))
            except queue.Empty:
                raise CallRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"the call took longer than {timeout_s:g} s (the gateway's limit)") from None
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            count += 1
            if count > max_records:
                raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"a call carries at most {max_records} records; send the rest in another call")
            yield item
    finally:
        done.set()


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
        tensor = self._grpcclient.InferInput(PAYLOAD, [len(payloads), 1], "BYTES")
        tensor.set_data_from_numpy(np.array(payloads, dtype=object).reshape(-1, 1))
        try:
            result = client.infer(self.model, [tensor], client_timeout=self.timeout_s)
        except InferenceServerException as err:
            raise of_kind(error_kind(err.status()), err.message() or str(err)) from None
        return result.as_numpy(PROBABILITY), result.as_numpy(DECISION)


    def max_batch_size(self) -> int:
        """The served model's `max_batch_size`, from Triton (0: the model does not batch)."""
        client = self._grpcclient.InferenceServerClient(self.url)
        try:
            return int(client.get_model_config(self.model, as_json=True, client_timeout=10)
                       ["config"].get("max_batch_size", 0))
        finally:
            client.close()


def check_window_size(window_size: int, max_batch_size: int, model: str) -> None:
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if window_size > max(max_batch_size, 1):
        raise ValueError(f"window size {window_size} is over {model}'s max_batch_size ({max_batch_size}): Triton "
                         f"would refuse each window; use at most {max(max_batch_size, 1)}")


class TritonWindows:
    """A window of records -> a SkillResult per record, scored by Triton; CallRefused when Triton fails."""

    def __init__(self, scorer):
        self.scorer = retrying(scorer)

    def __call__(self, window: Sequence[skill_pb2.SkillRecord], number: int) -> list[skill_pb2.SkillResult]:
        scored = score_isolating_bad_records([r.SerializeToString() for r in window], self.scorer)
        results = []
        for record, score in zip(window, scored):
            if score.error is not None and score.error.kind != INVALID:
                raise CallRefused(_LEGACY_CALL_STATUS[score.error.kind],
                                  f"scoring window {number} failed: {score.error.message}")
            results.append(legacy_result(record, score, number))
        return results


class SkillGateway(skill_pb2_grpc.SkillServicer):
    def __init__(self, scorer, window_size: int = DEFAULT_WINDOW_SIZE, limits: CallLimits = CallLimits(),
                 answer=None, mirror=None):
        """`answer` scores the windows the caller gets (default: Triton through `scorer`); `mirror`, when given,
        receives each window and its answer (servers.dual_run.DualRun) and must not block."""
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.answer = answer or TritonWindows(scorer)
        self.mirror = mirror
        self.window_size = window_size
        self.limits = limits

    def Score(self, request_iterator, context):  # noqa: N802 - the name is the legacy RPC's
        try:
            return self._score(request_iterator)
        except CallRefused as refused:
            context.abort(refused.code, refused.details)

    def _score(self, request_iterator) -> skill_pb2.SkillBatchResult:
        limits = self.limits
        records = records_within(request_iterator, limits.timeout_s, limits.max_records)
        results = []
        count = reply_bytes = 0
        for number, window in enumerate(windows(records, self.window_size)):
            count = number + 1
            answered = self.answer(window, number)
            reply_bytes += sum(r.ByteSize() for r in answered)
            if reply_bytes > limits.max_reply_bytes:
                raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"the reply would be over {limits.max_reply_bytes} bytes after {len(results)} "
                                  f"records; send fewer records (or shorter request ids) per call")
            if self.mirror is not None:
                self.mirror.submit(window, number, answered)
            results.extend(answered)
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
          workers: int = DEFAULT_CONCURRENT_CALLS, host: str = "[::]", limits: CallLimits = CallLimits(),
          answer=None, mirror=None) -> grpc.Server:
    """Started; the caller stops it (`server.stop(grace)`). The window size is checked against the model's
    `max_batch_size` when Triton answers; an unreachable Triton is not an error here (calls fail UNAVAILABLE until
    it is up)."""
    scorer = TritonScorer(triton_url, model)
    try:
        max_batch_size = scorer.max_batch_size()
    except Exception:  # noqa: BLE001 - Triton unreachable or the model absent: nothing to check against yet
        pass
    else:
        check_window_size(window_size, max_batch_size, model)
    # As many threads as calls allowed: a call over the cap is refused at once, never queued behind idle streams.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), maximum_concurrent_rpcs=workers)
    gateway = SkillGateway(scorer, window_size, limits, answer, mirror)
    skill_pb2_grpc.add_SkillServicer_to_server(gateway, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    return server
