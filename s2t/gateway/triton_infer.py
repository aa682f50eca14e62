"""Triton's `ModelInfer` over one persistent grpc.aio channel, for payloads that are already bytes.

The records go out as the bytes they arrived in (one BYTES row each, Triton's raw encoding) and the answers come
back as raw tensors read with numpy: no tensor library, no per-request client objects. Many windows share the
channel at once (HTTP/2 streams), so a call's windows are scored side by side instead of one round trip at a time.

A call sent to Triton is left to finish, whatever happens to its caller: Triton 2.51's gRPC frontend (also in the
NGC 24.10 image) can crash the whole server on a cancelled ModelInfer, a race between its two handler threads over
a released request state (SIGSEGV in ModelInferHandler::Process; fixed upstream in 2.57). Measured here: six legacy
callers whose windows held a record that is no SkillRecord, each window's Triton call cancelled when the gateway
refused the call, crashed tritonserver within 2 s in three runs out of three. A caller that goes away, a call the
gateway refuses and a window past `timeout_s` now leave their call to finish unread (`Calls` holds every call until
it ends). Two cuts remain, both rare: a call Triton leaves unanswered UNANSWERED_GRACE_S past `timeout_s` (its gRPC
deadline), and a call still running CLOSE_GRACE_S into close().
"""
from __future__ import annotations

import asyncio
from typing import Sequence

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from s2t.backends.runtime import bytes_tensor
from s2t.backends.runtime.serving_errors import (INTERNAL, INVALID, UNAVAILABLE, InternalError, NotAnsweredInTime,
                                                 of_kind)
from s2t.wire.names import DECISION, PAYLOAD, PROBABILITY

# Triton's gRPC status -> what it means for the legacy caller. Anything not listed is INTERNAL.
_TRITON_STATUS_KIND = {
    grpc.StatusCode.INVALID_ARGUMENT: INVALID,
    grpc.StatusCode.UNAVAILABLE: UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: UNAVAILABLE,
    # The model is not loaded (yet, or while a version is swapped): try again, as for an unreachable server.
    grpc.StatusCode.NOT_FOUND: UNAVAILABLE,
}
_NO_LIMIT = -1
# How much longer than the caller's timeout an unread call to Triton may run before its gRPC deadline cuts it.
UNANSWERED_GRACE_S = 300.0
# Calls to Triton running at once at most, read or not; past this, new windows are refused UNAVAILABLE (Triton is
# not answering) rather than piling up.
MAX_CALLS = 512
# How long close() lets running calls finish before the channel cuts them.
CLOSE_GRACE_S = 5.0


def error_kind(triton_status: grpc.StatusCode | None) -> str:
    return _TRITON_STATUS_KIND.get(triton_status, INTERNAL)


class TritonInfer:
    """`await scorer(payloads)` -> (probabilities, decisions) as numpy arrays, or a ServingError. Made and used on
    one event loop (grpc.aio channels belong to the loop that made them)."""

    def __init__(self, url: str, model: str = "risk_pipeline", timeout_s: float = 30.0):
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.calls = Calls()
        # Replies are as large as the window: no 4 MiB default cap between the gateway and its own Triton.
        self._channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", _NO_LIMIT),
                                                                ("grpc.max_send_message_length", _NO_LIMIT)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def __call__(self, payloads: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
        if len(self.calls) >= MAX_CALLS:
            raise of_kind(UNAVAILABLE, f"Triton has not answered {len(self.calls)} earlier calls")
        request = service_pb2.ModelInferRequest(model_name=self.model)
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = PAYLOAD, "BYTES"
        tensor.shape.extend((len(payloads), 1))
        request.raw_input_contents.append(bytes_tensor.encode(list(payloads)))
        for name in (PROBABILITY, DECISION):
            request.outputs.add().name = name
        call = self.calls.start(self._stub.ModelInfer(request, timeout=self.timeout_s + UNANSWERED_GRACE_S))
        # asyncio.wait neither cancels the call nor, unlike wait_for on Python 3.11, drops a cancellation of this
        # task that arrives as the call completes (the gateway ends a call past its time by cancelling it once).
        done, _ = await asyncio.wait((call,), timeout=self.timeout_s)
        if not done:
            raise NotAnsweredInTime(f"Triton did not answer within {self.timeout_s:g} s")
        # Read, not raised here: raised through this frame, the call's error would hold it in its traceback while
        # the frame holds the call that holds the error, a cycle left to the garbage collector.
        failure = call.exception()
        if failure is None:
            return answers(call.result(), len(payloads))
        if isinstance(failure, grpc.aio.AioRpcError):
            raise of_kind(error_kind(failure.code()), failure.details() or str(failure.code()))
        try:
            raise failure
        finally:
            del failure, call, done

    async def max_batch_size(self) -> int:
        """The served model's `max_batch_size`, from Triton (0: the model does not batch)."""
        reply = await self._stub.ModelConfig(service_pb2.ModelConfigRequest(name=self.model), timeout=10)
        return int(reply.config.max_batch_size)

    async def close(self) -> None:
        """Gives the calls still running, read or not, CLOSE_GRACE_S to finish, then closes the channel, which
        cancels those still running."""
        await self.calls.wait(CLOSE_GRACE_S)
        await self._channel.close()


class Calls:
    """Every call to Triton until it ends, whether its caller still waits or not: held (the event loop keeps only
    weak references to tasks) and its outcome read, so that none is reported as never retrieved."""

    def __init__(self):
        self._running: set[asyncio.Future] = set()

    def __len__(self) -> int:
        return len(self._running)

    def start(self, awaitable) -> asyncio.Future:
        call = asyncio.ensure_future(awaitable)
        self._running.add(call)
        call.add_done_callback(self._ended)
        return call

    def _ended(self, call: asyncio.Future) -> None:
        self._running.discard(call)
        if not call.cancelled():
            call.exception()

    async def wait(self, timeout: float) -> None:
        """Until every call has ended, or `timeout` seconds."""
        if self._running:
            await asyncio.wait(self._running, timeout=timeout)


def answers(reply, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, decisions) of a ModelInferResponse; InternalError when it is not what was asked for."""
    raw = dict(zip((output.name for output in reply.outputs), reply.raw_output_contents))
    if PROBABILITY not in raw or DECISION not in raw:
        raise InternalError(f"Triton's answer lacks {PROBABILITY} or {DECISION}: {sorted(raw)}")
    probabilities = np.frombuffer(raw[PROBABILITY], dtype="<f4")
    try:
        decisions = bytes_tensor.decode(raw[DECISION])
    except ValueError as err:
        raise InternalError(f"Triton's {DECISION} output: {err}") from None
    if len(probabilities) != rows or len(decisions) != rows:
        raise InternalError(f"{len(probabilities)} scores for {rows} records")
    return probabilities, np.array(decisions, dtype=object)
