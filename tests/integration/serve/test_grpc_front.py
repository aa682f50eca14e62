"""The gRPC front of the embedded tritonserver (native/grpc_front.cc, s2t/serve/grpc_front.py) on the real server.

Triton 2.51's gRPC front end crashes the whole server (Signal 11) when a client cancels a ModelInfer in flight or its
deadline expires while Triton works on it: four callers with a deadline of a few milliseconds beside four valid ones
took the server down within seconds. Behind the front, the same callers, and streaming callers that leave in the
middle of their sequences, leave the same server ready and answering, every valid answer correct. The front also
passes the admin key through, refuses an over-size message and calls past its limit by itself, forwards methods it
does not know. Inside tritonserver (the default) it ends with tritonserver and is back with the next one; as a process
of its own it ends with `s2t serve`, its port open while `s2t serve` starts a new server.

What Triton cannot show (the metadata and deadline a call arrives with, whether it was cancelled) is read from a
small gRPC server standing in for it, the front's upstream."""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from concurrent import futures
from contextlib import contextmanager

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from s2t.control.live_control import admin_headers
from s2t.serve import service_process
from s2t.serve.grpc_front import GrpcFront
from s2t.serve.request_limits import grpc_max_message_bytes
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from tests.integration.servers import serving, triton_server

KEY = "front-" + os.urandom(8).hex()
GRPC_KEY_HEADER = "triton-grpc-protocol-admin-key"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
HOT_SECONDS = 12
VALID_CALLERS, HOSTILE_CALLERS, STREAM_LEAVERS = 4, 4, 2
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    """Explicit mode with an admin key: the restricted APIs answer only callers whose key reaches Triton."""
    log = tmp_path_factory.mktemp("grpc_front") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log, model_control_mode="explicit",
                               admin_key=KEY)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in german_credit_data.records()]


@pytest.fixture(scope="module")
def direct(records):
    """Each record's probability and decision from the fused pipeline run in this process, as risk_pipeline runs it."""
    from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.triton_config import backend_parameters, load

    settings = read_parameters(PipelineSettings, backend_parameters(load(MODEL_REPOSITORY / "risk_pipeline")))
    scored = warm_pipeline(MODEL_REPOSITORY, settings, "risk_pipeline").score(records)
    return scored.probability.ravel(), scored.decision.ravel()


def pipeline_inputs(payloads: list[bytes]) -> list:
    tensor = grpcclient.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object))
    return [tensor]


def stream_request(sequence: str, place: int, payload: bytes) -> bytes:
    """One record of a risk_stream sequence as ModelStreamInfer carries it."""
    request = service_pb2.ModelInferRequest(model_name="risk_stream", id=str(place))
    request.parameters["sequence_id"].string_param = sequence
    request.parameters["sequence_start"].bool_param = place == 0
    request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(payload).to_bytes(4, "little") + payload)
    return request.SerializeToString()


def stream_record(records: list[bytes], sequence: str, sequence_id: int) -> bytes:
    return json.dumps({**json.loads(records[sequence_id]), "request_id": f"{sequence}/{sequence_id}",
                       "stream_id": sequence, "sequence_id": sequence_id}).encode()


def ready_over_http(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


class Watch:
    """For as long as the `with` lasts: the same tritonserver process, ready over HTTP at every look."""

    def __init__(self, server):
        self.server, self.pid = server, server.process.pid
        self.lapses: list[str] = []
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.25):
            self.looks += 1
            if self.server.process.poll() is not None or self.server.process.pid != self.pid:
                self.lapses.append(f"tritonserver exited with code {self.server.process.returncode}")
                return
            if not ready_over_http(self.server.http_url):
                self.lapses.append(f"not ready at {time.strftime('%H:%M:%S')}")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_callers_that_cancel_time_out_or_leave_mid_stream_beside_valid_ones_leave_the_server_up_and_right(
        server, records, direct):
    """For HOT_SECONDS (without the front, the hostile callers alone crashed the server within a few seconds): valid
    risk_pipeline callers, callers whose deadline is 0.2-3 ms, streaming callers on risk_stream that cancel their
    stream, close their channel or let its deadline expire mid-sequence."""
    probability, decision = direct
    deadline = time.monotonic() + HOT_SECONDS
    problems, answered, timed_out, left_streams = [], [0], [0], [0]

    def valid(k: int) -> None:
        rng = random.Random(k)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            while time.monotonic() < deadline:
                rows = sorted(rng.sample(range(len(records)), rng.randint(1, 4)))
                try:
                    result = client.infer("risk_pipeline", pipeline_inputs([records[i] for i in rows]))
                except InferenceServerException as err:
                    problems.append(f"valid call failed: {err}")
                    continue
                got = result.as_numpy("probability").ravel()
                if np.abs(got - probability[rows]).max() > TOLERANCE or \
                        result.as_numpy("decision").ravel().tolist() != decision[rows].tolist():
                    problems.append(f"wrong answer for rows {rows}: {got} {result.as_numpy('decision').ravel()}")
                answered[0] += 1
        finally:
            client.close()

    def hostile(k: int) -> None:
        rng = random.Random(100 + k)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            while time.monotonic() < deadline:
                try:
                    client.infer("risk_pipeline", pipeline_inputs([records[rng.randrange(len(records))]]),
                                 client_timeout=rng.uniform(0.0002, 0.003))
                except InferenceServerException as err:
                    timed_out[0] += "Deadline" in str(err)
        finally:
            client.close()

    def leaving(k: int) -> None:
        """Sequences of up to 6 records on one stream, left in three ways before their end."""
        rng = random.Random(200 + k)
        while time.monotonic() < deadline:
            sequence, way = f"leaving-{k}-{uuid.uuid4().hex[:8]}", rng.choice(("cancel", "close", "deadline"))
            payloads = [stream_record(records, sequence, i) for i in range(rng.randint(1, 6))]
            if way == "cancel":
                client = grpcclient.InferenceServerClient(server.grpc_url)
                client.start_stream(callback=lambda result, error: None)
                try:
                    for i, payload in enumerate(payloads):
                        client.async_stream_infer("risk_stream", pipeline_inputs([payload]), request_id=str(i),
                                                  sequence_id=sequence, sequence_start=i == 0)
                except InferenceServerException:
                    pass  # the stream broke: a server that died shows in the watch
                time.sleep(rng.uniform(0, 0.02))
                client.stop_stream(cancel_requests=True)
                client.close()
            else:
                channel = grpc.insecure_channel(server.grpc_url)
                sent = [stream_request(sequence, i, payload) for i, payload in enumerate(payloads)]
                call = channel.stream_stream(STREAM_INFER)(iter(sent), timeout=rng.uniform(0.005, 0.05)
                                                           if way == "deadline" else None)
                try:
                    next(call)  # the first answer, then leave
                except (grpc.RpcError, StopIteration):
                    pass
                time.sleep(rng.uniform(0, 0.02))
                channel.close()
            left_streams[0] += 1

    def valid_streams() -> None:
        from s2t.clients import stream_client
        features = [{"features": json.loads(r)["features"]} for r in records[:8]]
        while time.monotonic() < deadline:
            try:
                result = stream_client.run_stream(server.grpc_url, f"valid-{uuid.uuid4().hex[:8]}", features,
                                                  range(8))
            except (InferenceServerException, TimeoutError) as err:
                problems.append(f"valid stream failed: {err}")
                continue
            if not result.complete or result.errors or [a.status for a in result.answers] != ["OK"] * 8:
                problems.append(f"valid stream: complete {result.complete}, errors {result.errors[:2]}, "
                                f"answers {[a.status for a in result.answers]}")
            elif np.abs(np.array([a.probability for a in result.answers]) - probability[:8]).max() > TOLERANCE:
                problems.append(f"valid stream: wrong scores {[a.probability for a in result.answers]}")

    callers = [(valid, k) for k in range(VALID_CALLERS)] + [(hostile, k) for k in range(HOSTILE_CALLERS)]
    callers += [(leaving, k) for k in range(STREAM_LEAVERS)]
    with Watch(server) as watch, futures.ThreadPoolExecutor(len(callers) + 1) as pool:
        done = [pool.submit(caller, k) for caller, k in callers] + [pool.submit(valid_streams)]
        for each in done:
            each.result()
    assert watch.lapses == [], watch.lapses[:5]
    assert watch.looks > HOT_SECONDS
    assert problems == [], problems[:5]
    assert answered[0] > 100 * VALID_CALLERS, answered
    assert timed_out[0] > 100, f"only {timed_out[0]} calls timed out: the test proves nothing"
    assert left_streams[0] > 50, left_streams
    assert server.process.poll() is None


def test_the_admin_key_reaches_triton_through_the_front(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_model_repository_index()
        key = {GRPC_KEY_HEADER: admin_headers(KEY)["admin-key"]}
        index = client.get_model_repository_index(headers={**key, "x-s2t-caller": "tests"}, as_json=True)
        assert "risk_pipeline" in {model["name"] for model in index["models"]}
        assert client.get_log_settings(headers=key, as_json=True)["settings"]
    finally:
        client.close()


def inference_count(server, model: str) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        client.close()
    return sum(int(s["inference_stats"]["success"].get("count", 0)) + int(s["inference_stats"]["fail"].get("count", 0))
               for s in stats)


def test_a_message_over_the_limit_is_refused_by_the_front_and_never_reaches_triton(server, records, direct):
    limit = grpc_max_message_bytes([MODEL_REPOSITORY, ENSEMBLES])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = inference_count(server, "risk_pipeline")
        with pytest.raises(InferenceServerException) as refused:
            client.infer("risk_pipeline", pipeline_inputs([b" " * (limit // 4)] * 4))
        assert "RESOURCE_EXHAUSTED" in str(refused.value) and str(limit) in str(refused.value)
        assert inference_count(server, "risk_pipeline") == before
        # Within the limit and past gRPC's default of 4 MiB: answered.
        padded = [r + b" " * (60_000 - len(r)) for r in records[:80]]
        result = client.infer("risk_pipeline", pipeline_inputs(padded))
        assert np.abs(result.as_numpy("probability").ravel() - direct[0][:80]).max() <= TOLERANCE
    finally:
        client.close()


@pytest.mark.parametrize("method", ["/inference.GRPCInferenceService/NoSuchMethod", "/no.such.Service/Call"])
def test_a_method_triton_does_not_have_is_forwarded_and_answered_unimplemented(server, method):
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as unary:
            channel.unary_unary(method)(b"", timeout=10)
        with pytest.raises(grpc.RpcError) as stream:
            list(channel.stream_stream(method)(iter([b"", b"x"]), timeout=10))
    assert unary.value.code() == stream.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert ready_over_http(server.http_url)


@contextmanager
def held_streams(url: str, records: list[bytes], count: int):
    """`count` risk_stream sequences, each started and answered, their streams held open: calls Triton holds. Yields
    a function that sends each sequence's next record and returns the answers' statuses."""
    answers = [[] for _ in range(count)]
    sequences = [f"held-{k}-{uuid.uuid4().hex[:8]}" for k in range(count)]
    clients = []
    for k, sequence in enumerate(sequences):
        client = grpcclient.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error, k=k: answers[k].append(error or result))
        clients.append(client)
        client.async_stream_infer("risk_stream", pipeline_inputs([stream_record(records, sequence, 0)]),
                                  request_id="0", sequence_id=sequence, sequence_start=True)
    wait_until(lambda: all(answers), 30)

    def finish() -> list:
        for client, sequence in zip(clients, sequences):
            client.async_stream_infer("risk_stream", pipeline_inputs([stream_record(records, sequence, 1)]),
                                      request_id="1", sequence_id=sequence, sequence_end=True)
        wait_until(lambda: all(len(a) >= 2 for a in answers), 30)
        return answers

    try:
        yield finish
    finally:
        for client in clients:
            client.stop_stream()
            client.close()


def wait_until(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_calls_past_the_limit_are_refused_at_once_while_the_held_ones_are_answered(built_artifacts, tmp_path, records,
                                                                                    direct):
    log = tmp_path / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log, grpc_max_calls=4)) as small:
        with held_streams(small.grpc_url, records, 4) as finish:
            client = grpcclient.InferenceServerClient(small.grpc_url)
            began = time.monotonic()
            with pytest.raises(InferenceServerException) as refused:
                client.infer("risk_pipeline", pipeline_inputs(records[:1]))
            assert time.monotonic() - began < 2.0
            assert "UNAVAILABLE" in str(refused.value) and "4 calls" in str(refused.value)
            # Readiness draws on slots of its own: inference load never refuses it.
            assert client.is_server_ready()
            answers = finish()
        for each in answers:
            assert not isinstance(each[1], InferenceServerException), each[1]
            assert each[1].as_numpy("status").ravel()[0] == b"OK"
            assert abs(float(each[1].as_numpy("probability").ravel()[0]) - direct[0][1]) <= TOLERANCE
        # The streams closed, their slots are free again.
        wait_until(lambda: _answers(client, records), 10)
        client.close()
    assert "refused 1 call(s): 4 calls to tritonserver in flight" in log.read_text()


def _answers(client, records) -> bool:
    try:
        client.infer("risk_pipeline", pipeline_inputs(records[:1]))
        return True
    except InferenceServerException:
        return False


# ---- what Triton cannot show, read from a server standing in for it

def infer_message(word: str) -> bytes:
    """A ModelInferRequest whose id carries `word` to the stand-in: the front relays only what protobuf reads as
    one (and writes it again)."""
    return service_pb2.ModelInferRequest(model_name="m", id=word).SerializeToString()


class Upstream(grpc.GenericRpcHandler):
    """Records what each call arrives with and how it ended; unary calls sleep for the seconds their word (a
    ModelInferRequest's id, or the body of another method) says and answer with metadata of their own, streams
    answer each message's word and two more after the client's half-close."""

    def __init__(self):
        self.calls: list[dict] = []
        self.release = threading.Event()

    def service(self, details):
        method = details.method
        if method == STREAM_INFER:
            return grpc.stream_stream_rpc_method_handler(lambda requests, context: self.stream(method, requests,
                                                                                               context))
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self.unary(method, _word(
            method, request), context))

    def _record(self, method: str, context) -> dict:
        call = {"method": method, "metadata": dict(context.invocation_metadata()),
                "time_remaining": context.time_remaining(), "ended": None}
        self.calls.append(call)
        return call

    def unary(self, method: str, request: bytes, context) -> bytes:
        call = self._record(method, context)
        if request == b"hold":
            self.release.wait(30)
        else:
            time.sleep(_seconds(request))
        call["ended"] = "answered" if context.is_active() else "cancelled"
        context.send_initial_metadata((("x-upstream-initial", "i"),))
        context.set_trailing_metadata((("x-upstream-trailing", "t"), ("x-upstream-bin", b"\x00\xff")))
        if request == b"0.01":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "upstream says no")
        return b"answer:" + request

    def stream(self, method: str, requests, context):
        call = self._record(method, context)
        answered = threading.Event()
        # Told when the call ends however it ends: a call cancelled after its client's half-close (the front
        # half-closes upstream when the client's stream ends, then cancels it when that end was a cancellation) is
        # never asked for its next answer, so only this callback sees how it ended.
        context.add_callback(lambda: call.update(ended="answered" if answered.is_set() else "cancelled"))
        try:
            for request in requests:
                yield b"echo:" + _word(method, request)
        except grpc.RpcError:  # gRPC Python's request iterator says so when the call is cancelled
            return
        time.sleep(0.3)
        yield b"after half-close 1"
        yield b"after half-close 2"
        answered.set()


def _word(method: str, request: bytes) -> bytes:
    return service_pb2.ModelInferRequest.FromString(request).id.encode() if method in (INFER, STREAM_INFER) \
        else request


def no_deadline(call: dict) -> bool:
    """gRPC Python says "no deadline" as None or as the largest time it can hold."""
    return call["time_remaining"] is None or call["time_remaining"] > 1e9


def _seconds(request: bytes) -> float:
    try:
        return min(float(request), 5.0)
    except (TypeError, ValueError):
        return 0.0


@pytest.fixture
def stand_in():
    upstream = Upstream()
    server = grpc.server(futures.ThreadPoolExecutor(16))
    server.add_generic_rpc_handlers((upstream,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    front = GrpcFront(free_port(), port, max_message_bytes=1000, max_calls=3, drain_seconds=5).start()
    yield upstream, f"localhost:{front.public_port}", front
    upstream.release.set()
    assert front.stop() == 0
    server.stop(0)


def test_metadata_reaches_upstream_and_its_answer_comes_back_but_never_the_clients_deadline(stand_in):
    upstream, url, _ = stand_in
    with grpc.insecure_channel(url) as channel:
        answer, call = channel.unary_unary(INFER).with_call(
            infer_message("0"), timeout=20, metadata=(("x-custom", "v"), (GRPC_KEY_HEADER, "k"), ("x-blob-bin", b"\x01\x02")))
        assert answer == b"answer:0"
        assert dict(call.initial_metadata())["x-upstream-initial"] == "i"
        trailing = dict(call.trailing_metadata())
        assert trailing["x-upstream-trailing"] == "t" and trailing["x-upstream-bin"] == b"\x00\xff"
        with pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(INFER)(infer_message("0.01"), timeout=20)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == "upstream says no"
    received = upstream.calls[0]
    assert received["metadata"]["x-custom"] == "v" and received["metadata"][GRPC_KEY_HEADER] == "k"
    assert received["metadata"]["x-blob-bin"] == b"\x01\x02"
    assert no_deadline(received)
    # A method the front does not know goes upstream all the same.
    with grpc.insecure_channel(url) as channel:
        assert channel.unary_unary("/no.such.Service/Call")(b"0", timeout=20) == b"answer:0"
    assert upstream.calls[-1]["method"] == "/no.such.Service/Call"


def test_a_unary_call_whose_client_leaves_is_answered_upstream_and_holds_its_slot_until_then(stand_in):
    upstream, url, _ = stand_in
    with grpc.insecure_channel(url) as channel:
        infer = channel.unary_unary(INFER)
        with pytest.raises(grpc.RpcError) as expired:
            infer(infer_message("1.5"), timeout=0.05)
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        leaving = infer.future(infer_message("1.5"))
        time.sleep(0.1)
        leaving.cancel()
        # Three slots: the two left behind still hold theirs, so one call fits and the next is refused.
        held = infer.future(infer_message("hold"))
        wait_until(lambda: len(upstream.calls) == 3, 5)
        with pytest.raises(grpc.RpcError) as refused:
            infer(infer_message("0"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "3 calls" in refused.value.details()
        wait_until(lambda: upstream.calls[0]["ended"] and upstream.calls[1]["ended"], 5)
        assert infer(infer_message("0"), timeout=5) == b"answer:0"
        upstream.release.set()
        assert held.result(timeout=5) == b"answer:hold"
    assert [c["ended"] for c in upstream.calls] == ["answered"] * 4


def test_a_stream_is_half_closed_upstream_when_its_client_half_closes_and_cancelled_when_it_leaves(stand_in):
    upstream, url, _ = stand_in
    with grpc.insecure_channel(url) as channel:
        stream = channel.stream_stream(STREAM_INFER)
        assert list(stream(iter([infer_message("a"), infer_message("b")]), timeout=20)) == [b"echo:a", b"echo:b", b"after half-close 1",
                                                                 b"after half-close 2"]
        outgoing = threading.Event()

        def requests():
            yield infer_message("c")
            outgoing.wait(10)

        leaving = stream(requests())
        assert next(leaving) == b"echo:c"
        leaving.cancel()
        outgoing.set()
        wait_until(lambda: upstream.calls[1]["ended"] is not None, 5)
    # A stream's cancellation is safe in Triton 2.51 (only a unary call's crashes it), and it stops a decoupled
    # model generating for nobody.
    assert [c["ended"] for c in upstream.calls] == ["answered", "cancelled"]
    assert all(map(no_deadline, upstream.calls))


def test_hostile_clients_leave_the_front_running_and_answering(stand_in):
    """Garbage, empty and doubled unary bodies, over-size messages, cancels at any moment, abrupt disconnects."""
    upstream, url, front = stand_in
    rng = random.Random(7)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        channel = grpc.insecure_channel(url)
        way = rng.randrange(5)
        try:
            if way == 0:
                channel.unary_unary(INFER)(bytes(rng.randrange(256) for _ in range(rng.randrange(2000))),
                                           timeout=rng.uniform(0.001, 0.05))
            elif way == 1:  # a unary method called with no message, or two
                list(channel.stream_stream(INFER)(iter([infer_message("0")] * rng.randrange(3)), timeout=1))
            elif way == 2:
                channel.stream_stream(STREAM_INFER)(iter([b"x"] * rng.randrange(50))).cancel()
            elif way == 3:
                channel.unary_unary(INFER).future(infer_message("0.05"), metadata=(("x-" + "k" * rng.randrange(1, 2000), "v"),))
            else:
                channel.stream_stream(STREAM_INFER)(iter([b"y" * 5000]))
        except grpc.RpcError:
            pass
        time.sleep(rng.uniform(0, 0.005))
        channel.close()
    assert front.running()
    upstream.release.set()
    with grpc.insecure_channel(url) as channel:
        wait_until(lambda: _stand_in_answers(channel), 10)


def _stand_in_answers(channel) -> bool:
    try:
        return channel.unary_unary(INFER)(infer_message("0"), timeout=5) == b"answer:0"
    except grpc.RpcError:
        return False


@pytest.mark.parametrize("args, message", [
    ([], "--listen needs HOST:PORT"),
    (["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1"], "--upstream needs HOST:PORT, got '127.0.0.1'"),
    (["--listen", "127.0.0.1:1", "--upstream", "127.0.0.1:2"], "--max-message-bytes is required"),
    (["--max-calls", "0"], "--max-calls needs a whole number from 1"),
    (["--threads", "two"], "--threads needs a whole number"),
    (["--listen"], "--listen needs a value"),
    (["--port", "1"], "unknown option --port"),
], ids=["nothing", "no-port", "no-limit", "no-calls", "words", "no-value", "unknown"])
def test_the_front_refuses_bad_arguments_saying_which(args, message):
    from s2t.serve.grpc_front import BINARY
    done = subprocess.run([str(BINARY), *args], capture_output=True, text=True, timeout=10)
    assert done.returncode == 2 and message in done.stderr and "usage:" in done.stderr, done.stderr


def test_the_front_says_when_its_port_is_taken():
    from s2t.serve.grpc_front import BINARY
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([str(BINARY), "--listen", f"0.0.0.0:{port}", "--upstream", "127.0.0.1:1",
                               "--max-message-bytes", "10"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and f"cannot listen on 0.0.0.0:{port}" in done.stderr, done.stderr


# ---- the front under `s2t serve`

def serve(tmp_path, *options: str) -> tuple:
    """`s2t serve` with `options`: the front (None inside tritonserver), tritonserver, the gRPC and HTTP urls."""
    http_port, grpc_port = free_port(), free_port()
    process, _ = service_process.start(
        ["serve", "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(free_port()),
         "--supervisor-port", "0", "--exit-timeout", "5", "--repository", str(MODEL_REPOSITORY),
         "--repository", str(ENSEMBLES), *options], "ready:", timeout=180, log=tmp_path / "serve.log")
    children = psutil.Process(process.pid).children()
    front = next((c for c in children if c.name() == "s2t_grpc_front"), None)
    triton = next(c for c in children if c.name() == "tritonserver")
    return process, front, triton, f"localhost:{grpc_port}", f"localhost:{http_port}"


def test_inside_tritonserver_the_front_is_back_with_the_next_tritonserver_and_ends_with_it(built_artifacts, tmp_path,
                                                                                          records):
    process, front, triton, grpc_url, _ = serve(tmp_path)
    try:
        assert front is None and "libs2t_grpc_front.so" in open(f"/proc/{triton.pid}/maps").read()
        assert grpc_answers(grpc_url, records)
        triton.kill()
        assert gone(triton, 10) and not grpc_answers(grpc_url, records)
        wait_until(lambda: grpc_answers(grpc_url, records), 120)
        triton = next(c for c in psutil.Process(process.pid).children() if c.name() == "tritonserver")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert gone(triton, 10)
    log = (tmp_path / "serve.log").read_text()
    assert "s2t_grpc_front: stopping: 0 call(s) to tritonserver in flight" in log
    assert "s2t_grpc_front: stopped\n" in log


def gone(process: psutil.Process, timeout_s: float) -> bool:
    try:
        process.wait(timeout_s)
        return True
    except psutil.TimeoutExpired:
        return False


def grpc_answers(url: str, records) -> bool:
    client = grpcclient.InferenceServerClient(url)
    try:
        return client.infer("risk_pipeline", pipeline_inputs(records[:1])).as_numpy("decision") is not None
    except InferenceServerException:
        return False
    finally:
        client.close()


def test_the_process_fronts_port_stays_open_across_a_new_tritonserver_a_dead_one_is_replaced_and_it_ends_with_s2t_serve(
        built_artifacts, tmp_path, records):
    process, front, triton, grpc_url, _ = serve(tmp_path, "--grpc-front-process")
    try:
        assert grpc_answers(grpc_url, records)
        triton.kill()
        client = grpcclient.InferenceServerClient(grpc_url)
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):  # refused by the front, not by the kernel
            client.infer("risk_pipeline", pipeline_inputs(records[:1]))
        client.close()
        wait_until(lambda: grpc_answers(grpc_url, records), 120)
        assert front.is_running() and front in psutil.Process(process.pid).children()
        # A front that dies is started again.
        front.kill()
        wait_until(lambda: grpc_answers(grpc_url, records), 30)
        front = next(c for c in psutil.Process(process.pid).children() if c.name() == "s2t_grpc_front")
        # The keeper says so once the new front is started, which may answer before the line is written.
        wait_until(lambda: "the gRPC front exited with code -9; started again" in (tmp_path / "serve.log").read_text(),
                   10)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    assert gone(front, 10)


def test_the_process_front_ends_when_s2t_serve_is_killed(built_artifacts, tmp_path):
    process, front, triton, _, _ = serve(tmp_path, "--grpc-front-process")
    process.kill()
    process.wait()
    assert gone(front, 15) and gone(triton, 30)


@pytest.mark.parametrize("name, process_front", [("LIBRARY", False), ("HOOK", False), ("BINARY", True)])
def test_serve_names_how_to_build_a_missing_front(built_artifacts, tmp_path, monkeypatch, name, process_front):
    from s2t.serve import grpc_front
    from s2t.serve.triton_server import ServerError

    missing = tmp_path / getattr(grpc_front, name).name
    monkeypatch.setattr(grpc_front, name, missing)
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], tmp_path / "tritonserver.log",
                           grpc_front_process=process_front)
    with pytest.raises(ServerError, match=rf"{missing} is not built: `make native` builds it"):
        server.start()
    assert server.process is None and server.front is None
