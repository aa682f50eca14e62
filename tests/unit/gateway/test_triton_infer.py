"""TritonInfer leaves every call it sent to finish: a caller that stops waiting, a window past its timeout and
close() never cancel the call (Triton 2.51 can crash on a cancelled ModelInfer; the integration test
test_gateway_triton_calls.py shows it on the real server). Here a gRPC server that answers when told stands in for a
slow Triton, so each moment is chosen rather than raced."""
import asyncio
import gc

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from s2t.backends.runtime import bytes_tensor
from s2t.backends.runtime.serving_errors import UNAVAILABLE, NotAnsweredInTime, ServingError
from s2t.gateway import triton_infer
from s2t.gateway.triton_infer import Calls, TritonInfer


class SlowTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers each ModelInfer once `release` is set; `outcomes` says how each call ended on the server's side."""

    def __init__(self):
        self.release = asyncio.Event()
        self.outcomes: list[str] = []

    async def ModelInfer(self, request, context):  # noqa: N802 - the gRPC method's name
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.outcomes.append("cancelled")
            raise
        rows = request.inputs[0].shape[0]
        reply = service_pb2.ModelInferResponse(model_name=request.model_name)
        for name in ("probability", "decision"):
            reply.outputs.add().name = name
        reply.raw_output_contents.append(np.full(rows, 0.25, dtype="<f4").tobytes())
        reply.raw_output_contents.append(bytes_tensor.encode([b"APPROVE"] * rows))
        self.outcomes.append("answered")
        return reply


def run(scenario):
    """`scenario(infer, slow)` on a fresh event loop with the stand-in server listening."""
    async def main():
        slow = SlowTriton()
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(slow, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await scenario(lambda **kw: TritonInfer(f"127.0.0.1:{port}", **kw), slow)
        finally:
            await server.stop(None)
    return asyncio.run(main())


async def until(condition, timeout=5.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def released_then_closed(infer, slow) -> list[str]:
    """Lets the stand-in answer, waits until no call runs, closes: how each call ended on the server's side."""
    slow.release.set()
    await until(lambda: len(infer.calls) == 0)
    await infer.close()
    return slow.outcomes


def test_a_caller_that_stops_waiting_leaves_the_call_to_finish():
    async def scenario(make, slow):
        infer = make()
        caller = asyncio.ensure_future(infer([b"{}", b"{}"]))
        await until(lambda: len(infer.calls) == 1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert len(infer.calls) == 1
        return await released_then_closed(infer, slow)
    assert run(scenario) == ["answered"]


def test_a_window_past_its_timeout_is_unavailable_and_its_call_still_finishes():
    async def scenario(make, slow):
        infer = make(timeout_s=0.05)
        with pytest.raises(NotAnsweredInTime) as late:
            await infer([b"{}"])
        assert late.value.kind == UNAVAILABLE and "did not answer within 0.05 s" in str(late.value)
        return await released_then_closed(infer, slow)
    assert run(scenario) == ["answered"]


def test_an_answer_in_time_is_read_and_nothing_is_left_behind():
    async def scenario(make, slow):
        infer = make()
        slow.release.set()
        probabilities, decisions = await infer([b"{}", b"{}", b"{}"])
        assert probabilities.tolist() == [0.25] * 3 and decisions.tolist() == [b"APPROVE"] * 3
        assert len(infer.calls) == 0
        await infer.close()
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_past_the_cap_of_running_calls_new_windows_are_refused_without_a_call(monkeypatch):
    monkeypatch.setattr(triton_infer, "MAX_CALLS", 2)

    async def scenario(make, slow):
        infer = make(timeout_s=0.05)
        for _ in range(2):
            with pytest.raises(ServingError):
                await infer([b"{}"])
        with pytest.raises(ServingError) as refused:
            await infer([b"{}"])
        assert refused.value.kind == UNAVAILABLE and "not answered 2 earlier calls" in str(refused.value)
        return await released_then_closed(infer, slow)
    assert run(scenario) == ["answered", "answered"]


@pytest.mark.parametrize("grace_s, answer_after_s, outcome", [
    (triton_infer.CLOSE_GRACE_S, 0.1, "answered"),  # an unread call answered within close's grace ends as answered
    (0.1, None, "cancelled"),  # the one cut close() makes, stated so that it stays the only one
])
def test_close_gives_unread_calls_its_grace_and_no_more(monkeypatch, grace_s, answer_after_s, outcome):
    monkeypatch.setattr(triton_infer, "CLOSE_GRACE_S", grace_s)

    async def scenario(make, slow):
        infer = make(timeout_s=0.05)
        with pytest.raises(NotAnsweredInTime):
            await infer([b"{}"])
        if answer_after_s is not None:
            asyncio.get_running_loop().call_later(answer_after_s, slow.release.set)
        await infer.close()
        await until(lambda: slow.outcomes)
        return slow.outcomes
    assert run(scenario) == [outcome]


def test_close_lets_a_caller_still_waiting_get_its_answer():
    async def scenario(make, slow):
        infer = make()
        caller = asyncio.ensure_future(infer([b"{}", b"{}"]))
        await until(lambda: len(infer.calls) == 1)
        asyncio.get_running_loop().call_later(0.1, slow.release.set)
        await infer.close()
        probabilities, _ = await caller
        assert probabilities.tolist() == [0.25, 0.25]
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_a_cancellation_arriving_as_the_call_completes_still_ends_the_caller():
    """The gateway ends a call past its time by cancelling its task once: that must not be lost when Triton's
    answer lands in the same turn (asyncio.wait_for on Python 3.11 returned the answer instead)."""
    async def scenario():
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        infer = TritonInfer("127.0.0.1:1")
        infer._stub = type("Stub", (), {"ModelInfer": lambda self, request, timeout: answer})()
        caller = asyncio.ensure_future(infer([b"{}"]))
        await until(lambda: len(infer.calls) == 1)
        answer.set_result(service_pb2.ModelInferResponse())
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await infer.close()
    asyncio.run(scenario())


def test_calls_read_each_outcome_and_let_go_of_it():
    async def scenario():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        calls = Calls()
        failing, cancelled, done = (loop.create_future() for _ in range(3))
        done.set_result(1)
        for future in (failing, cancelled, done):
            calls.start(future)
        await asyncio.sleep(0)
        assert len(calls) == 2
        failing.set_exception(RuntimeError("unread"))
        cancelled.cancel()
        await asyncio.sleep(0)
        assert len(calls) == 0
        del failing, cancelled, done
        gc.collect()
        return reported
    assert asyncio.run(scenario()) == [], "an unread call's error was reported as never retrieved"
