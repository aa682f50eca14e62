"""`s2t gateway`: the legacy Skill service (s2t/wire/skill.proto) in front of Triton.

Legacy callers stream `SkillRecord`s and get one `SkillBatchResult` when they close their side, as they always
did. The gateway keeps the legacy fixed-size windows: every `window_size` records (and the rest at the end) are
scored as one Triton request on `risk_pipeline`, the records travelling as the protobuf bytes they came in
(skill_adapter reads both forms). A bad record is answered INVALID_RECORD with the adapter's message and its
window-mates are scored; a failure of Triton itself fails the call with the matching gRPC status.

It is built as a bridge that adds little to each call: one asyncio event loop (grpc.aio) serves every call, so a
call costs a coroutine rather than a thread; `Score` is a generic handler that receives each record as its raw
bytes and sends them on unparsed; a call's windows go to Triton as soon as they are full, several at once over one
persistent channel, while the caller's next records are still arriving. Call slots come from
s2t.gateway.call_admission: a slot is free again the moment its call returns, silent calls give theirs up to callers
that need one, and one connection holds at most its share.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import grpc
from google.protobuf.message import DecodeError

from s2t.backends.scoring.batch_scoring import retrying_async, score_isolating_bad_records_async
from s2t.gateway.call_admission import AdmissionLimits, CallAdmission, Ending, Ticket
from s2t.gateway.gateway_options import GatewayOptions
from s2t.backends.runtime.serving_errors import INTERNAL, INVALID, UNAVAILABLE
from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES
from s2t.wire import skill_pb2
from s2t.wire.skill_call import CallRefused, too_many_records

# Windows of one call scored at once: enough to keep Triton busy while the caller sends, few enough that a fast
# caller is held back by gRPC's flow control instead of being buffered here.
WINDOWS_IN_FLIGHT = 4
# Event loop turns a window's request takes to leave (the scorer's coroutine, then grpc.aio's own send task).
TURNS_TO_SEND = 2
# How often calls are checked against their timeouts; an ended call learns it within this.
SWEEP_INTERVAL_S = 0.1
_LEGACY_CALL_STATUS = {UNAVAILABLE: grpc.StatusCode.UNAVAILABLE, INTERNAL: grpc.StatusCode.INTERNAL}
_SERVICE, _METHOD = "skill.Skill", "Score"

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class CallLimits:
    timeout_s: float = GatewayOptions.call_timeout_s
    max_records: int = GatewayOptions.max_records
    # gRPC clients refuse a message over 4 MiB unless told otherwise: a longer reply would be scored, then lost.
    max_reply_bytes: int = 4 * 1024 * 1024
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_message_bytes: int = GatewayOptions.max_message_bytes

    def __post_init__(self):
        if min(self.timeout_s, self.max_records, self.max_reply_bytes, self.max_record_bytes) <= 0:
            raise ValueError(f"call limits must be positive, got {self}")
        if self.max_message_bytes < self.max_record_bytes:
            raise ValueError(f"max_message_bytes ({self.max_message_bytes}) must be at least max_record_bytes "
                             f"({self.max_record_bytes})")


def check_window_size(window_size: int, max_batch_size: int, model: str) -> None:
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if window_size > max(max_batch_size, 1):
        raise ValueError(f"window size {window_size} is over {model}'s max_batch_size ({max_batch_size}): Triton "
                         f"would refuse each window; use at most {max(max_batch_size, 1)}")


def parse_records(window: Sequence[bytes], number: int, window_size: int) -> list[skill_pb2.SkillRecord]:
    """The window's records parsed (for the ids their results echo); CallRefused naming the first one that is no
    SkillRecord: without its request id it cannot be answered on its own."""
    records = []
    for place, raw in enumerate(window):
        try:
            records.append(skill_pb2.SkillRecord.FromString(raw))
        except DecodeError as err:
            raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"record {number * window_size + place} of the call is not a skill.SkillRecord "
                              f"({type(err).__name__}: {err})") from None
    return records


WindowScorer = Callable[[Sequence[bytes], int], Awaitable[list]]


class TritonWindows:
    """`await windows(records, number)`: a window of raw records -> a SkillResult per record, scored by Triton
    (`scorer`: s2t.gateway.triton_infer.TritonInfer or any coroutine of payloads); CallRefused when Triton fails. A
    record over `max_record_bytes` is answered INVALID_RECORD here and never sent."""

    def __init__(self, scorer, window_size: int, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        self._closes = getattr(scorer, "close", None)
        self.scorer = retrying_async(scorer)
        self.window_size = window_size
        self.max_record_bytes = max_record_bytes

    async def close(self) -> None:
        """Closes the scorer's channel when it has one."""
        if self._closes is not None:
            await self._closes()

    async def __call__(self, window: Sequence[bytes], number: int) -> list[skill_pb2.SkillResult]:
        limit = self.max_record_bytes
        fits = [i for i, raw in enumerate(window) if len(raw) <= limit]
        sent = window if len(fits) == len(window) else [window[i] for i in fits]
        # Sent before the records are parsed for their ids: the parse and the results' ids are done while Triton
        # scores, not between the window's last record and its request. Two turns of the event loop: one for the
        # scorer to build its request, one for grpc.aio to put it on the wire.
        scoring = asyncio.ensure_future(score_isolating_bad_records_async(sent, self.scorer))
        try:
            for _ in range(TURNS_TO_SEND):
                await asyncio.sleep(0)
            results = [skill_pb2.SkillResult(request_id=record.request_id, sequence_id=record.sequence_id,
                                             window=number)
                       for record in parse_records(window, number, self.window_size)]
            scored = iter(await scoring)
        finally:
            scoring.cancel()  # a record that is no SkillRecord, or the call ended: nobody reads the answer
        for raw, result in zip(window, results):
            if len(raw) > limit:
                _refuse_record(result, f"payload: {len(raw)} bytes is over the limit of {limit}")
                continue
            score = next(scored)
            if score.error is None:
                result.status = skill_pb2.OK
                result.probability = score.probability
                result.decision = score.decision.decode()
            elif score.error.kind == INVALID:
                _refuse_record(result, score.error.message)
            else:
                raise CallRefused(_LEGACY_CALL_STATUS.get(score.error.kind, grpc.StatusCode.INTERNAL),
                                  f"scoring window {number} failed: {score.error.message}")
        return results


def _refuse_record(result: skill_pb2.SkillResult, message: str) -> None:
    result.status = skill_pb2.INVALID_RECORD
    result.error = message


def in_thread(windows_scorer: Callable[[Sequence[bytes], int], list]) -> WindowScorer:
    """A blocking window scorer (the legacy service's client) as the gateway's coroutine: it runs on a worker
    thread and the event loop keeps serving the other calls."""
    async def score(window: Sequence[bytes], number: int) -> list:
        return await asyncio.to_thread(windows_scorer, window, number)
    return score


class BlockingWindows:
    """A coroutine window scorer for threads (the dual-run mirror's pool): each thread runs its own event loop with
    its own scorer from `make` (grpc.aio channels belong to the loop that made them)."""

    def __init__(self, make: Callable[[], WindowScorer]):
        self._make = make
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made: list[tuple[asyncio.AbstractEventLoop, WindowScorer]] = []  # one per thread of a bounded pool

    def __call__(self, window: Sequence[bytes], number: int) -> list:
        local = self._local
        if getattr(local, "loop", None) is None:
            local.loop = asyncio.new_event_loop()
            local.windows = local.loop.run_until_complete(_made(self._make))
            with self._lock:
                self._made.append((local.loop, local.windows))
        return local.loop.run_until_complete(local.windows(window, number))

    def close(self) -> None:
        """Closes every thread's scorer (its channel) and loop; call once the threads no longer score."""
        with self._lock:
            made, self._made = self._made, []
        for loop, windows in made:
            close = getattr(windows, "close", None)
            try:
                if close is not None:
                    loop.run_until_complete(close())
            except Exception:  # noqa: BLE001 - one scorer that fails to close must not keep the others open
                _LOG.exception("closing a mirror scorer failed")
            finally:
                loop.close()


async def _made(make):
    return make()


class SkillGateway:
    """`score` is the `skill.Skill/Score` handler: raw records in, a serialized SkillBatchResult out."""

    def __init__(self, answer: WindowScorer, window_size: int = GatewayOptions.window_size,
                 limits: CallLimits = CallLimits(), admission: CallAdmission | None = None, mirror=None,
                 windows_in_flight: int = WINDOWS_IN_FLIGHT):
        """`answer` scores the windows the caller gets; `mirror`, when given, receives each window and its answer
        (s2t.gateway.dual_run.DualRun) and must not block."""
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
        self.answer = answer
        self.mirror = mirror
        self.window_size = window_size
        self.limits = limits
        self.admission = admission or CallAdmission(AdmissionLimits(call_timeout_s=limits.timeout_s))
        self.windows_in_flight = windows_in_flight

    async def score(self, requests, context) -> bytes:
        answer = await self._answer(requests, context.peer())
        if isinstance(answer, bytes):
            return answer
        # grpc.aio keeps the AbortError on the call, and the error's traceback keeps every frame it leaves: a frame
        # still holding the call's context (or its request stream) would make a cycle that only the garbage
        # collector frees. The abort is made, then raised from a frame that no longer holds them.
        aborting = _abort(context, answer)
        del context, requests
        await aborting

    async def _answer(self, requests, caller: str) -> bytes | CallRefused:
        """The serialized SkillBatchResult, or why the call is refused (a CallRefused that was not raised, or was
        raised and no longer carries its traceback)."""
        admission = self.admission.admit(caller)
        if admission.refused is not None:
            return _refused(admission.refused)
        if admission.reclaimed is not None:
            _end(admission.reclaimed)
        ticket = admission.ticket
        ticket.task = asyncio.current_task()
        try:
            return await self._score(requests, ticket)
        except asyncio.CancelledError:
            if ticket.ending is None:  # the caller went away, or the server stops: nothing to answer
                raise
            asyncio.current_task().uncancel()
            return _refused(ticket.ending)
        except CallRefused as err:
            # Its traceback holds this frame, which would hold it: a cycle kept until the garbage collector's turn.
            return err.with_traceback(None)
        finally:
            # Before the answer leaves: the caller's next call finds the slot free.
            self.admission.release(ticket)

    async def _score(self, requests, ticket: Ticket) -> bytes:
        limits, size, admission = self.limits, self.window_size, self.admission
        pending: collections.deque = collections.deque()
        results: list = []
        window: list = []
        count = number = reply_bytes = 0
        try:
            async for raw in requests:
                admission.heard(ticket)
                count += 1
                if count > limits.max_records:
                    raise too_many_records(limits.max_records)
                window.append(raw)
                if len(window) == size:
                    pending.append(asyncio.ensure_future(self._window(window, number)))
                    number, window = number + 1, []
                    if len(pending) >= self.windows_in_flight:
                        reply_bytes = self._keep(await pending.popleft(), results, reply_bytes)
            admission.closed(ticket)
            if window:
                pending.append(asyncio.ensure_future(self._window(window, number)))
                number += 1
            while pending:
                reply_bytes = self._keep(await pending.popleft(), results, reply_bytes)
        finally:
            for task in pending:
                task.cancel()
        return skill_pb2.SkillBatchResult(results=results, window_size=size, windows=number).SerializeToString()

    async def _window(self, window: list, number: int) -> list:
        answered = await self.answer(window, number)
        if self.mirror is not None:
            self.mirror.submit(window, number, answered)
        return answered

    def _keep(self, answered: list, results: list, reply_bytes: int) -> int:
        """`results` with the window's answers; the reply's size so far, refused once over the limit."""
        reply_bytes += sum(r.ByteSize() for r in answered)
        if reply_bytes > self.limits.max_reply_bytes:
            raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"the reply would be over {self.limits.max_reply_bytes} bytes after {len(results)} "
                              f"records; send fewer records (or shorter request ids) per call")
        results.extend(answered)
        return reply_bytes

    async def sweep(self) -> None:
        """Ends the calls past their timeouts, for as long as the gateway serves."""
        while True:
            for ticket in self.admission.overdue():
                _end(ticket)
            await asyncio.sleep(SWEEP_INTERVAL_S)


def _refused(ending: Ending) -> CallRefused:
    return CallRefused(grpc.StatusCode[ending.status], ending.message, ending.retry_after_s)


def _end(ticket: Ticket) -> None:
    task = ticket.task
    if task is not None and not task.done():
        task.cancel()


def _abort(context, refused: CallRefused) -> Awaitable[None]:
    """`context.abort(...)` not yet awaited: this frame has ended before the abort raises."""
    metadata = () if refused.retry_after_s is None else (("retry-after-ms", str(int(refused.retry_after_s * 1000))),)
    return context.abort(refused.code, refused.details, trailing_metadata=metadata)


class GatewayServer:
    """The gateway's grpc.aio server, on an event loop of its own thread so that a command can start it and wait
    for a signal. `stop(grace)` returns an Event set once it has stopped, as grpc.Server's does."""

    def __init__(self, start: Callable[[], Awaitable[tuple[grpc.aio.Server, Callable[[], Awaitable[None]]]]]):
        self._loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._server, self._close = self._loop.run_until_complete(start())
            except BaseException as err:  # noqa: BLE001 - handed to the thread that called serve()
                failure.append(err)
                started.set()
                self._loop.close()
                return
            started.set()
            self._loop.run_forever()
            self._loop.close()
            self._stopped.set()

        self._thread = threading.Thread(target=run, name="gateway-loop", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]

    def stop(self, grace: float | None) -> threading.Event:
        async def stop() -> None:
            try:
                await self._server.stop(grace)
                await self._close()
            finally:
                self._loop.stop()

        if not self._stopped.is_set():
            asyncio.run_coroutine_threadsafe(stop(), self._loop)
        return self._stopped


def serve(port: int, triton_url: str, model: str = GatewayOptions.model,
          window_size: int = GatewayOptions.window_size, workers: int = GatewayOptions.workers, host: str = "[::]",
          limits: CallLimits = CallLimits(), answer: WindowScorer | None = None, mirror=None,
          calls_per_caller: int | None = None,
          idle_timeout_s: float = AdmissionLimits.idle_timeout_s) -> GatewayServer:
    """Started; the caller stops it (`server.stop(grace)`). `workers` call slots, `calls_per_caller` of them at
    most for one connection (default: all; gRPC clients share one connection per process and
    target, so a connection is a client process). The window size is checked against the model's
    `max_batch_size` when Triton answers; an unreachable Triton is not an error here (calls fail UNAVAILABLE until
    it is up)."""
    admission_limits = AdmissionLimits(slots=workers, per_caller=calls_per_caller, call_timeout_s=limits.timeout_s,
                                       idle_timeout_s=idle_timeout_s)

    async def start():
        from s2t.gateway.triton_infer import TritonInfer
        scorer = TritonInfer(triton_url, model)
        try:
            try:
                max_batch_size = await scorer.max_batch_size()
            except grpc.aio.AioRpcError:  # Triton unreachable or the model absent: nothing to check against yet
                pass
            else:
                check_window_size(window_size, max_batch_size, model)
            gateway = SkillGateway(answer or TritonWindows(scorer, window_size, limits.max_record_bytes),
                                   window_size, limits, CallAdmission(admission_limits), mirror)
            server = grpc.aio.server(options=[("grpc.max_receive_message_length", limits.max_message_bytes)])
            handler = grpc.stream_unary_rpc_method_handler(gateway.score)  # no (de)serializer: raw bytes both ways
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {_METHOD: handler}),))
            try:
                bound = server.add_insecure_port(f"{host}:{port}")
            except RuntimeError:
                bound = 0
            if bound == 0:
                raise OSError(f"cannot listen on {host}:{port}")
            await server.start()
        except BaseException:
            # A gateway that does not start leaves no channel to Triton open behind it.
            await scorer.close()
            raise
        sweeper = asyncio.ensure_future(gateway.sweep())

        async def close() -> None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await scorer.close()
        return server, close

    return GatewayServer(start)
