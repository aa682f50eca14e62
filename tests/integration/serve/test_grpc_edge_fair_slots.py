"""Fair slots at the gRPC front inside tritonserver: one client that opens 1,200 ModelInfer calls whose message never
comes and 300 ModelStreamInfer streams that send nothing (with nothing but the one limit of 1,024 calls, every other
client was refused UNAVAILABLE "holds 1024 calls to it, its limit" until those calls went) holds no more than its
share of the slots, each of its calls ends once its first message is overdue, and beside it other clients'
ServerReady, ServerLive and ModelInfer are answered throughout; the same tritonserver at the end."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"
GREEDY_CALLS, GREEDY_STREAMS = 1200, 300
# The front ends a call whose first message has not come within this (its --message-seconds).
MESSAGE_SECONDS = 10
# One connection per channel: gRPC Python otherwise shares one between channels to the same address.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("grpc_edge_fair_slots") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:4]]


def pipeline_request(payload: bytes) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="risk_pipeline", id="fair")
    request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(payload).to_bytes(4, "little") + payload)
    return request.SerializeToString()


class Greedy:
    """On one connection: GREEDY_CALLS ModelInfer calls and GREEDY_STREAMS streams, none of which ever sends a
    message; how each ended (its code and details), or None while it has not."""

    def __init__(self, url: str):
        self.url, self.opened, self.ended = url, threading.Event(), []
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(self.url, options=OWN_CONNECTION) as channel:
            calls = [channel.stream_stream(INFER)() for _ in range(GREEDY_CALLS)]
            calls += [channel.stream_stream(STREAM_INFER)() for _ in range(GREEDY_STREAMS)]
            await asyncio.sleep(1)
            self.opened.set()

            async def outcome(call) -> tuple:
                try:
                    return await asyncio.wait_for(call.code(), MESSAGE_SECONDS + 20), await call.details()
                except asyncio.TimeoutError:
                    call.cancel()
                    return None, "still open"

            self.ended = await asyncio.gather(*(outcome(c) for c in calls))


def test_a_greedy_client_holds_its_share_its_silent_calls_end_and_others_are_answered_beside_it(server, records):
    pid = server.process.pid
    greedy = Greedy(server.grpc_url)
    began = time.monotonic()
    greedy.thread.start()
    assert greedy.opened.wait(30)
    time.sleep(1)
    wrong, answered = [], 0
    with grpc.insecure_channel(server.grpc_url, options=OWN_CONNECTION) as channel:
        ready, live, infer = (channel.unary_unary(m) for m in (SERVER_READY, SERVER_LIVE, INFER))
        until = time.monotonic() + 5
        while time.monotonic() < until:
            for name, method, body in (("ServerReady", ready, b""), ("ServerLive", live, b""),
                                       ("ModelInfer", infer, pipeline_request(records[answered % 4]))):
                try:
                    method(body, timeout=5)
                    answered += 1
                except grpc.RpcError as err:
                    wrong.append((name, err.code().name, err.details()))
    greedy.thread.join(MESSAGE_SECONDS + 40)
    lasted = time.monotonic() - began
    assert wrong == [], wrong[:3]
    assert answered > 30, answered
    codes = [code.name if code is not None else None for code, _ in greedy.ended]
    assert len(codes) == GREEDY_CALLS + GREEDY_STREAMS and None not in codes, codes.count(None)
    shares = [details for code, details in greedy.ended if code == grpc.StatusCode.UNAVAILABLE]
    assert all("its share" in d for d in shares), shares[:3]
    # A quarter of the 1,024 slots: the rest of its calls refused at once, those it held ended when overdue.
    assert codes.count("UNAVAILABLE") == GREEDY_CALLS + GREEDY_STREAMS - 256, codes.count("UNAVAILABLE")
    assert codes.count("CANCELLED") == 256, {c: codes.count(c) for c in set(codes)}
    assert lasted < MESSAGE_SECONDS + 30, lasted
    assert server.process.poll() is None and server.process.pid == pid
