"""Fair slots at the gRPC front inside tritonserver. One connection: one client that opens 1,200 ModelInfer calls whose message never
comes and 300 ModelStreamInfer streams that send nothing (with nothing but the one limit of 1,024 calls, every other
client was refused UNAVAILABLE "holds 1024 calls to it, its limit" until those calls went) holds no more than its
share of the slots, each of its calls ends once its first message is overdue, and beside it other clients'
ServerReady, ServerLive and ModelInfer are answered throughout; the same tritonserver at the end. Several connections
from one address (shares were once counted per connection, so 4 connections took every slot) hold one address's
share, inference and health calls alike, and a stream quiet for --stream-idle-seconds ends."""
from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time

import grpc
import pytest
from tritonclient.grpc import service_pb2

from s2t.soak.from_address import FromAddress
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from tests.integration.servers import serving, triton_server

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
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


def answered(message: bytes) -> bool:
    """Whether a stream's message is an answer, not an error in the stream."""
    response = service_pb2.ModelStreamInferResponse.FromString(message)
    return not response.error_message and response.infer_response.model_name == "risk_pipeline"


class Greedy:
    """On one connection: `calls` ModelInfer calls and `streams` streams (or `health` health checks), none of which
    ever sends a message; how each ended (its code and details), or None while it has not."""

    def __init__(self, url: str, calls: int = GREEDY_CALLS, streams: int = GREEDY_STREAMS, health: int = 0):
        self.url, self.opened, self.ended = url, threading.Event(), []
        self.counts = (calls, streams, health)
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        calls_, streams, health = self.counts
        async with grpc.aio.insecure_channel(self.url, options=OWN_CONNECTION) as channel:
            calls = [channel.stream_stream(INFER)() for _ in range(calls_)]
            calls += [channel.stream_stream(STREAM_INFER)() for _ in range(streams)]
            calls += [channel.stream_stream(HEALTH_CHECK)() for _ in range(health)]
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


def test_several_connections_from_one_address_hold_one_share_and_other_addresses_are_answered(server, records):
    """4 connections from 127.0.0.2, each with 300 silent ModelInfer calls and 80 silent health checks: the address
    holds a quarter of the inference slots (256) and of the others' (64) in all; ModelInfer, ServerReady and health
    checks from 127.0.0.1 and from 127.0.0.3 are answered beside them."""
    pid = server.process.pid
    port = int(server.grpc_url.rsplit(":", 1)[1])
    attacker, other = FromAddress("127.0.0.2", port), FromAddress("127.0.0.3", port)
    try:
        greedy = [Greedy(attacker.url, calls=300, streams=0, health=80) for _ in range(4)]
        for g in greedy:
            g.thread.start()
        assert all(g.opened.wait(30) for g in greedy)
        time.sleep(1)
        wrong, answered = [], 0
        for url in (server.grpc_url, other.url):
            with grpc.insecure_channel(url, options=OWN_CONNECTION) as channel:
                ready, health, infer = (channel.unary_unary(m) for m in (SERVER_READY, HEALTH_CHECK, INFER))
                for _ in range(5):
                    for name, method, body in (("ServerReady", ready, b""), ("Health", health, b""),
                                               ("ModelInfer", infer, pipeline_request(records[answered % 4]))):
                        try:
                            method(body, timeout=5)
                            answered += 1
                        except grpc.RpcError as err:
                            wrong.append((url, name, err.code().name, err.details()))
        for g in greedy:
            g.thread.join(MESSAGE_SECONDS + 40)
    finally:
        attacker.close()
        other.close()
    assert wrong == [], wrong[:3]
    assert answered == 30
    ended = [e for g in greedy for e in g.ended]
    codes = [code.name if code is not None else None for code, _ in ended]
    assert len(codes) == 4 * 380 and None not in codes, codes.count(None)
    refused = [details for code, details in ended if code == grpc.StatusCode.UNAVAILABLE]
    assert all("holds its share" in d for d in refused), refused[:3]
    # Held until overdue (CANCELLED): the address's share of 1,024 inference slots and of 256 others, no more.
    assert codes.count("CANCELLED") == 256 + 64, {c: codes.count(c) for c in set(codes)}
    assert server.process.poll() is None and server.process.pid == pid


def test_a_stream_quiet_for_its_idle_limit_ends_and_a_busy_one_goes_on(server, records):
    """The front (its binary, before this tritonserver's own gRPC endpoint) with --stream-idle-seconds 3: streams
    that send one request and then nothing are ended within seconds of their answer (they held their slots for good
    before), while a stream that sends a request each second for 6 s has every answer."""
    from s2t.serve.grpc_front import BINARY
    pid = server.process.pid
    port = free_port()
    front = subprocess.Popen([str(BINARY), "--listen", f"127.0.0.1:{port}", "--upstream",
                              f"127.0.0.1:{server.triton_grpc_port}", "--max-message-bytes", "1000000",
                              "--max-calls", "16", "--stream-idle-seconds", "3"], stderr=subprocess.PIPE, text=True)
    try:
        url = f"127.0.0.1:{port}"
        with grpc.insecure_channel(url) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            quiet, stop = [], threading.Event()

            def one_then_nothing():
                yield pipeline_request(records[0])
                stop.wait(60)

            for _ in range(8):
                quiet.append(channel.stream_stream(STREAM_INFER)(one_then_nothing()))
            began = time.monotonic()
            for call in quiet:
                assert answered(next(call))  # its answer came
            busy = [pipeline_request(records[i % 4]) for i in range(6)]

            def paced():
                for message in busy:
                    yield message
                    time.sleep(1)

            answers = list(channel.stream_stream(STREAM_INFER)(paced(), timeout=30))
            assert len(answers) == 6 and all(map(answered, answers))
            codes = []
            for call in quiet:
                with pytest.raises(grpc.RpcError) as ended:
                    next(call)
                codes.append(ended.value.code())
            lasted = time.monotonic() - began
            stop.set()
            assert codes == [grpc.StatusCode.CANCELLED] * 8
            assert lasted < 12, lasted
            # Their slots are free again: 12 new streams, open together, are each answered. Loopback may hold all
            # of the 16 slots but the reserve (2), so the 8 quiet streams still holding theirs would leave room for 6.
            held = threading.Event()

            def one_then_held():
                yield pipeline_request(records[1])
                held.wait(30)

            again = [channel.stream_stream(STREAM_INFER)(one_then_held()) for _ in range(12)]
            try:
                assert all(answered(next(call)) for call in again)
            finally:
                held.set()
            assert all(list(call) == [] for call in again)
    finally:
        front.terminate()
        front.wait(30)
    assert server.process.poll() is None and server.process.pid == pid
