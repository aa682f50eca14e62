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

from backends import bytes_tensor
from backends.errors import UNAVAILABLE, ServingError
from legacy import triton_infer
from legacy.triton_infer import Abandoned, TritonInfer


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


def test_a_caller_that_stops_waiting_leaves_the_call_to_finish():
    async def scenario(make, slow):
        infer = make()
        caller = asyncio.ensure_future(infer([b"{}", b"{}"]))
        await asyncio.sleep(0.2)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert len(infer.abandoned) == 1
        slow.release.set()
        await until(lambda: len(infer.abandoned) == 0)
        await infer.close()
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_a_window_past_its_timeout_is_unavailable_and_its_call_still_finishes():
    async def scenario(make, slow):
        infer = make(timeout_s=0.2)
        with pytest.raises(ServingError) as late:
            await infer([b"{}"])
        assert late.value.kind == UNAVAILABLE and "did not answer within 0.2 s" in str(late.value)
        slow.release.set()
        await until(lambda: len(infer.abandoned) == 0)
        await infer.close()
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_an_answer_in_time_is_read_and_nothing_is_left_behind():
    async def scenario(make, slow):
        infer = make()
        slow.release.set()
        probabilities, decisions = await infer([b"{}", b"{}", b"{}"])
        assert probabilities.tolist() == [0.25] * 3 and decisions.tolist() == [b"APPROVE"] * 3
        assert len(infer.abandoned) == 0
        await infer.close()
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_past_the_cap_of_unread_calls_new_windows_are_refused_without_a_call(monkeypatch):
    monkeypatch.setattr(triton_infer, "MAX_ABANDONED", 2)

    async def scenario(make, slow):
        infer = make(timeout_s=0.1)
        for _ in range(2):
            with pytest.raises(ServingError):
                await infer([b"{}"])
        with pytest.raises(ServingError) as refused:
            await infer([b"{}"])
        assert refused.value.kind == UNAVAILABLE and "not answered 2 earlier calls" in str(refused.value)
        slow.release.set()
        await until(lambda: len(infer.abandoned) == 0)
        await infer.close()
        return slow.outcomes
    assert run(scenario) == ["answered", "answered"]


def test_close_lets_unread_calls_finish_within_its_grace():
    async def scenario(make, slow):
        infer = make(timeout_s=0.1)
        with pytest.raises(ServingError):
            await infer([b"{}"])
        asyncio.get_running_loop().call_later(0.3, slow.release.set)
        await infer.close()
        await until(lambda: slow.outcomes)
        return slow.outcomes
    assert run(scenario) == ["answered"]


def test_abandoned_reads_each_outcome_and_lets_go_of_it():
    async def scenario():
        loop = asyncio.get_running_loop()
        reported = []
        loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
        abandoned = Abandoned()
        failing, cancelled, done = (loop.create_future() for _ in range(3))
        done.set_result(1)
        for future in (failing, cancelled, done):
            abandoned.add(future)
        assert len(abandoned) == 2
        failing.set_exception(RuntimeError("unread"))
        cancelled.cancel()
        await asyncio.sleep(0)
        assert len(abandoned) == 0
        del failing, cancelled, done
        gc.collect()
        return reported
    assert asyncio.run(scenario()) == [], "an unread call's error was reported as never retrieved"
