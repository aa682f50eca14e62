"""The gRPC front inside tritonserver's process (native/grpc_front.cc built as libs2t_grpc_front.so, started by
native/grpc_front_hook.c), as `s2t serve` runs it: ModelInfer answered through Triton's C API must be the answer
Triton's own gRPC front end gives, byte for byte, for every request it takes, and the same refusal (code and words)
for every request it does not: those it relays, or Triton refuses alike. Valid callers beside malformed ones are
answered right, each bad request alone refused, the same server throughout."""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("grpc_front_in_process") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return [json.dumps({"request_id": f"r-{i}", "features": r}).encode()
            for i, r in enumerate(german_credit_data.records()[:64])]


def bytes_tensor(items: list[bytes]) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


def pipeline_request(payloads: list[bytes], model: str = "risk_pipeline", **fields) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    request.inputs.add(name="payload", datatype="BYTES", shape=[len(payloads), 1])
    request.raw_input_contents.append(bytes_tensor(payloads))
    return request


def scorer_request(rows: int) -> service_pb2.ModelInferRequest:
    rng = np.random.default_rng(7)
    request = service_pb2.ModelInferRequest(model_name="risk_scorer", id="scorer")
    request.inputs.add(name="categorical", datatype="INT64", shape=[rows, 13])
    request.inputs.add(name="numeric", datatype="FP32", shape=[rows, 7])
    request.raw_input_contents.append(rng.integers(0, 3, (rows, 13), dtype=np.int64).tobytes())
    request.raw_input_contents.append(rng.normal(size=(rows, 7)).astype(np.float32).tobytes())
    return request


def call(url: str, request: service_pb2.ModelInferRequest) -> tuple:
    """(status code name, details, the answer or None) of one ModelInfer sent as raw bytes."""
    with grpc.insecure_channel(url) as channel:
        infer = channel.unary_unary(INFER)
        try:
            answer = infer(request.SerializeToString(), timeout=30)
            return "OK", "", service_pb2.ModelInferResponse.FromString(answer)
        except grpc.RpcError as err:
            return err.code().name, err.details(), None


def valid_requests(records: list[bytes]) -> dict[str, service_pb2.ModelInferRequest]:
    with_outputs = pipeline_request(records[:2], id="two", model_version="1")
    with_outputs.outputs.add(name="decision")
    as_perf_analyzer = pipeline_request(records[2:3])
    as_perf_analyzer.parameters["triton_enable_empty_final_response"].bool_param = True
    with_priority = pipeline_request(records[3:4])  # a request parameter: relayed, Triton applies it
    with_priority.parameters["priority"].int64_param = 1
    ensemble = pipeline_request(records[4:5], model="risk_pipeline_ensemble", id="ensemble")
    return {"one record": pipeline_request(records[:1]), "eight records with an id": pipeline_request(
        records[:8], id="batch-of-8"), "a version and one output": with_outputs, "perf_analyzer's parameter":
        as_perf_analyzer, "a priority": with_priority, "packed tensors": scorer_request(5), "an ensemble": ensemble}


class RawRequest:
    """A request whose bytes no protobuf library would write (a string field that is not UTF-8), sent as they are:
    `call` asks it for its bytes as it asks a protobuf message."""

    def __init__(self, request: service_pb2.ModelInferRequest, placeholder: bytes, raw: bytes):
        self.serialized = request.SerializeToString().replace(placeholder, raw)

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name for it
        return self.serialized


def refused_requests(records: list[bytes]) -> dict[str, service_pb2.ModelInferRequest]:
    cases = {"an unknown model": pipeline_request(records[:1], model="no_such_model"),
             "an unknown version": pipeline_request(records[:1], model_version="7"),
             "a version that is no number": pipeline_request(records[:1], model_version="latest")}
    wrong_name = pipeline_request(records[:1])
    wrong_name.inputs[0].name = "record"
    wrong_type = pipeline_request(records[:1])
    wrong_type.inputs[0].datatype = "FP32"
    short = pipeline_request(records[:2])
    short.inputs[0].shape[:] = [3, 1]
    torn = pipeline_request(records[:1])
    torn.raw_input_contents[0] = (500).to_bytes(4, "little") + b"{}"
    no_contents = pipeline_request(records[:1])
    del no_contents.raw_input_contents[:]
    typed = service_pb2.ModelInferRequest(model_name="risk_pipeline")
    typed.inputs.add(name="payload", datatype="BYTES", shape=[1, 1]).contents.bytes_contents.append(records[0])
    unknown_output = pipeline_request(records[:1])
    unknown_output.outputs.add(name="no_such_output")
    decoupled = pipeline_request(records[:1], model="risk_stream")
    not_utf8 = RawRequest(pipeline_request(records[:1], id="XX"), b"\x1a\x02XX", b"\x1a\x02\xff\xfe")
    cases.update({"a wrong input name": wrong_name, "a wrong datatype": wrong_type, "a shape its data does not fill":
                  short, "a BYTES element past its end": torn, "no raw contents": no_contents,
                  "typed contents": typed, "an unknown output": unknown_output, "a decoupled model": decoupled,
                  "an id that is not UTF-8": not_utf8})
    return cases


def test_every_answer_is_the_one_tritons_own_front_end_gives(server, records):
    for name, request in valid_requests(records).items():
        ours, triton = call(server.grpc_url, request), call(server.triton_grpc_url, request)
        assert ours[0] == "OK", (name, ours)
        assert ours == triton, name
    # typed contents are Triton's to read: relayed, answered as Triton answers them
    _, _, typed = call(server.grpc_url, refused_requests(records)["typed contents"])
    assert typed is not None and typed.model_name == "risk_pipeline"


# Bytes protobuf does not parse: Triton's endpoint refuses them INTERNAL, the front INVALID_ARGUMENT with protobuf's
# reason (test_grpc_edge_requests.py).
NOT_PARSED = ("an id that is not UTF-8",)


def test_every_refusal_is_tritons_own_code_and_words(server, records):
    for name, request in refused_requests(records).items():
        if name == "typed contents" or name in NOT_PARSED:
            continue
        ours, triton = call(server.grpc_url, request), call(server.triton_grpc_url, request)
        assert ours[0] != "OK", (name, ours)
        assert ours == triton, name


def test_malformed_requests_beside_valid_ones_are_refused_alone_and_the_valid_answered_right(server, records):
    """Four valid callers and four sending only requests Triton refuses, for a few seconds, all in flight at once:
    every valid answer is the one a quiet server gave, every bad request gets its own refusal."""
    expected = {i: call(server.triton_grpc_url, pipeline_request([records[i]], id=str(i)))[2] for i in range(16)}
    bad = [r for n, r in refused_requests(records).items() if n not in ("typed contents",)]
    pid, stop = server.process.pid, time.monotonic() + 6
    wrong, counts = [], {"valid": 0, "refused": 0}
    lock = threading.Lock()

    def valid(seed: int):
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = channel.unary_unary(INFER)
            i = seed
            while time.monotonic() < stop:
                i = (i + 1) % 16
                answer = service_pb2.ModelInferResponse.FromString(
                    infer(pipeline_request([records[i]], id=str(i)).SerializeToString(), timeout=30))
                with lock:
                    counts["valid"] += 1
                    if answer != expected[i]:
                        wrong.append(("valid", i))

    def hostile(seed: int):
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = channel.unary_unary(INFER)
            i = seed
            while time.monotonic() < stop:
                i = (i + 1) % len(bad)
                try:
                    infer(bad[i].SerializeToString(), timeout=30)
                    with lock:
                        wrong.append(("answered", i))
                except grpc.RpcError as err:
                    with lock:
                        counts["refused"] += 1
                        if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                            wrong.append((err.code().name, i))

    threads = [threading.Thread(target=valid, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=hostile, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert counts["valid"] > 100 and counts["refused"] > 100, counts
    assert server.process.poll() is None and server.process.pid == pid


def test_the_front_lives_in_tritonserver_and_the_stubs_start_without_it(server):
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libs2t_grpc_front.so" in maps and "libs2t_grpc_front_hook.so" in maps
    stubs = [p for p in psutil.Process(server.process.pid).children(recursive=True)
             if "triton_python_backend_stub" in " ".join(p.cmdline())]
    assert stubs
    for stub in stubs:
        assert "libs2t_grpc_front" not in Path(f"/proc/{stub.pid}/maps").read_text()
        assert "libs2t_grpc_front" not in stub.environ().get("LD_PRELOAD", "")


def _stream_record(records: list[bytes], sequence: str, place: int) -> grpcclient.InferInput:
    record = {**json.loads(records[place]), "request_id": f"{sequence}/{place}", "stream_id": sequence,
              "sequence_id": place}
    payload = grpcclient.InferInput("payload", [1, 1], "BYTES")
    payload.set_data_from_numpy(np.array([[json.dumps(record).encode()]], dtype=object))
    return payload


def _stop(tmp_path, records, open_stream: bool) -> tuple[int, float, str]:
    """tritonserver stopped (with a risk_stream caller whose sequence has ended but whose stream stays open, or with
    none): its exit code, how long the stop took, its log."""
    log = tmp_path / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log, stop_gracefully=True, exit_timeout_seconds=3)
    answers: list = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with serving(server):
        if open_stream:
            client.start_stream(callback=lambda result, error: answers.append(error or result))
            for place in (0, 1):
                client.async_stream_infer("risk_stream", [_stream_record(records, "left-open", place)],
                                          request_id=str(place), sequence_id="left-open",
                                          sequence_start=place == 0, sequence_end=place == 1)
            deadline = time.monotonic() + 30
            while len(answers) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(answers) == 2 and not any(isinstance(a, Exception) for a in answers), \
                [str(a) for a in answers]
        else:
            assert client.is_server_ready()
        began = time.monotonic()
        code = server.stop()
        stopped_after = time.monotonic() - began
    if open_stream:
        client.stop_stream()
    client.close()
    return code, stopped_after, log.read_text()


def test_a_stop_ends_the_front_with_tritonserver_which_exits_0(built_artifacts, tmp_path, records):
    code, _, text = _stop(tmp_path, records, open_stream=False)
    assert code == 0, text[-3000:]
    assert "s2t_grpc_front: stopping: 0 call(s) to tritonserver in flight" in text
    assert "s2t_grpc_front: stopped\n" in text


def test_the_front_leaves_no_connection_for_tritons_grpc_server_to_wait_on_when_it_has_stopped(built_artifacts,
                                                                                              tmp_path):
    """After Triton's own stop the front ends, and with it its relay's connection to Triton's gRPC endpoint: Triton's
    gRPC server, stopped next, waits for every connection it has (a connection nobody reads any more held each
    stop 3 s)."""
    log = tmp_path / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log, stop_gracefully=True, exit_timeout_seconds=3)
    with serving(server):
        process = psutil.Process(server.process.pid)
        endpoint = server.triton_grpc_port
        server.process.send_signal(signal.SIGTERM)
        stopped_at, held_after = None, []
        while server.process.poll() is None:
            try:
                relayed = [c for c in process.net_connections(kind="tcp")
                           if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == endpoint]
            except psutil.NoSuchProcess:
                break
            if stopped_at is None and "s2t_grpc_front: stopped\n" in log.read_text():
                stopped_at = time.monotonic()
            if stopped_at is not None and relayed:
                held_after.append(round(time.monotonic() - stopped_at, 2))
            time.sleep(0.02)
        code = server.process.wait()
    assert code == 0, log.read_text()[-3000:]
    assert stopped_at is not None, log.read_text()[-3000:]
    # Closing a connection takes gRPC's event engine a moment; held for seconds, it was never closed.
    assert not [after for after in held_after if after > 0.5], held_after


def test_a_stream_left_open_holds_tritons_stop_as_without_the_front_and_nothing_more(built_artifacts, tmp_path,
                                                                                     records):
    """Triton 2.51 may not unload a model while a stream to it is open, so its stop can run to the exit timeout and
    exit 1, as it does on its own endpoint. The front adds nothing to that: it cancels the stream once Triton's stop
    returns, rather than at its drain's deadline (the exit timeout and 5 s more), and neither hangs nor aborts the
    exit (a negative code: a signal)."""
    code, stopped_after, text = _stop(tmp_path, records, open_stream=True)
    assert code == (1 if "Exit timeout expired" in text else 0), text[-3000:]
    assert "s2t_grpc_front: stopping: 1 call(s) to tritonserver in flight" in text  # the open stream
    assert "s2t_grpc_front: stopped" in text
    assert stopped_after < 3 + 5, stopped_after
