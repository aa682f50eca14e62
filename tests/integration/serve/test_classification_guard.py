"""A caller that asks for the classification of a BYTES output must get an error for that request alone. Triton 2.51's
front ends (HTTP and gRPC alike, src/classification.cc) divide by the datatype's byte size, 0 for BYTES, and die of
SIGFPE. The fronts refuse it before Triton sees it, naming the output; behind them, the hook preloaded into every
tritonserver `s2t serve` starts (native/grpc_front_hook.c) makes Triton's own front ends refuse it as later releases
do (the gRPC front's own process, which cannot see the model, relays it there). Attacked on every way in: the HTTP
port, the public gRPC port (unary and streamed), and Triton's own gRPC endpoint behind the front, from several callers
at once beside valid traffic, with the gRPC front inside tritonserver and as a process of its own."""
from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import requests
from tritonclient.grpc import service_pb2

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server
from tests.integration.traffic import PACE_S

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
# Triton's own words, as later releases and the hook give them.
REFUSAL = "class result not available for output due to unsupported type 'BYTES'"
# The fronts' words: the field, the output and why.
HTTP_REFUSAL = ("outputs[0].parameters.classification: output 'decision' of model 'risk_pipeline' is BYTES, and "
                "classification needs a numeric output")
GRPC_REFUSAL = ("outputs[0].parameters['classification']: output 'decision' of model 'risk_pipeline' is BYTES, and "
                "only a numeric output can be classified")
CLASS_COUNT = 5


@pytest.fixture(scope="module", params=["front inside tritonserver", "front process"])
def server(request, built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("classification_guard") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log,
                               grpc_front_process=request.param == "front process")) as running:
        yield running


@pytest.fixture(scope="module")
def record(german_credit_data) -> bytes:
    return json.dumps({"request_id": "r-1", "features": german_credit_data.records()[0]}).encode()


def http_body(record: bytes, output: str | None = None) -> dict:
    body = {"inputs": [{"name": "payload", "datatype": "BYTES", "shape": [1, 1], "data": [record.decode()]}]}
    if output is not None:
        body["outputs"] = [{"name": output, "parameters": {"classification": CLASS_COUNT}}]
    return body


def grpc_request(record: bytes, output: str | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="risk_pipeline", id="guard")
    request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(record).to_bytes(4, "little") + record)
    if output is not None:
        requested = request.outputs.add(name=output)
        requested.parameters["classification"].int64_param = CLASS_COUNT
    return request


def unary(port: int, request: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str, bytes]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(INFER, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=lambda b: b)
        try:
            return grpc.StatusCode.OK, "", call(request, timeout=30)
        except grpc.RpcError as err:
            return err.code(), err.details(), b""


def streamed(port: int, requests_: list[service_pb2.ModelInferRequest]) -> tuple[list[str], grpc.StatusCode, str]:
    """Each answer's error message (empty for an answer), and how the stream ended."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(STREAM, request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        answers = []
        try:
            for answer in call(iter(requests_), timeout=30):
                answers.append(answer.error_message)
        except grpc.RpcError as err:
            return answers, err.code(), err.details()
        return answers, grpc.StatusCode.OK, ""


def streamed_refusal(server, asks: list[bool]) -> tuple[list[str], grpc.StatusCode, str]:
    """How a stream whose first message asks for it (of those `asks` says do) ends: inside tritonserver the front
    ends the stream at that message; its own process relays the stream, and Triton answers each such message alone
    with its refusal."""
    if server.grpc_front_process:
        return [REFUSAL if ask else "" for ask in asks], grpc.StatusCode.OK, ""
    return [], grpc.StatusCode.INVALID_ARGUMENT, f"message 1 of the stream: {GRPC_REFUSAL}"


def grpc_front_refusal(server) -> str:
    return REFUSAL if server.grpc_front_process else GRPC_REFUSAL


def test_classification_of_a_numeric_output_is_still_answered(server, record):
    answer = requests.post(f"http://{server.http_url}/v2/models/risk_pipeline/infer",
                           json=http_body(record, "probability"), timeout=30)
    assert answer.status_code == 200, answer.text
    [output] = answer.json()["outputs"]
    value, index = output["data"][0].split(":")
    assert 0.0 <= float(value) <= 1.0 and index == "0"
    for port in (server.grpc_port, server.triton_grpc_port):
        code, details, answer = unary(port, grpc_request(record, "probability"))
        assert code == grpc.StatusCode.OK, details
        [output] = service_pb2.ModelInferResponse.FromString(answer).outputs
        assert (output.name, output.datatype) == ("probability", "BYTES")


@pytest.mark.parametrize("way", ["http", "grpc front", "grpc front streamed", "triton's own grpc"])
def test_classification_of_a_bytes_output_is_refused_for_that_request_alone(server, record, way):
    if way == "http":
        answer = requests.post(f"http://{server.http_url}/v2/models/risk_pipeline/infer",
                               json=http_body(record, "decision"), timeout=30)
        assert (answer.status_code, answer.json()) == (400, {"error": HTTP_REFUSAL})
    elif way == "grpc front streamed":
        got = streamed(server.grpc_port, [grpc_request(record, "decision"), grpc_request(record)])
        assert got == streamed_refusal(server, [True, False])
    else:
        port = server.grpc_port if way == "grpc front" else server.triton_grpc_port
        code, details, _ = unary(port, grpc_request(record, "decision"))
        refusal = grpc_front_refusal(server) if way == "grpc front" else REFUSAL
        assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, refusal)
    assert server.process.poll() is None


def test_callers_asking_for_it_beside_valid_traffic_cost_no_valid_answer(server, record):
    pid = server.process.pid
    quiet_http = requests.post(f"http://{server.http_url}/v2/models/risk_pipeline/infer",
                               json=http_body(record), timeout=30).json()
    quiet_grpc = unary(server.grpc_port, grpc_request(record))
    assert quiet_grpc[0] == grpc.StatusCode.OK
    stop, failures, valid_answers = threading.Event(), queue.Queue(), queue.Queue()

    def valid_caller() -> None:
        with requests.Session() as session:
            while not stop.wait(PACE_S):
                answer = session.post(f"http://{server.http_url}/v2/models/risk_pipeline/infer",
                                      json=http_body(record), timeout=30)
                if answer.status_code != 200 or answer.json() != quiet_http:
                    failures.put(("http", answer.status_code, answer.text[:200]))
                got = unary(server.grpc_port, grpc_request(record))
                if got != quiet_grpc:
                    failures.put(("grpc", got[0], got[1]))
                valid_answers.put(1)

    def hostile_caller(way: int) -> list:
        refusals = []
        for _ in range(25):
            if way == 0:
                answer = requests.post(f"http://{server.http_url}/v2/models/risk_pipeline/infer",
                                       json=http_body(record, "decision"), timeout=30)
                refusals.append((answer.status_code, answer.text))
            elif way == 3:
                answers, code, details = streamed(server.grpc_port, [grpc_request(record, "decision")] * 3)
                refusals.append((tuple(answers), code, details))
            else:
                port = server.grpc_port if way == 1 else server.triton_grpc_port
                refusals.append(unary(port, grpc_request(record, "decision"))[:2])
        return refusals

    callers = [threading.Thread(target=valid_caller) for _ in range(4)]
    for caller in callers:
        caller.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            refusals = list(pool.map(hostile_caller, range(4)))
    finally:
        stop.set()
        for caller in callers:
            caller.join()
    assert failures.empty(), list(failures.queue)[:5]
    assert valid_answers.qsize() > 0
    assert [(code, json.loads(text)) for code, text in refusals[0]] == [(400, {"error": HTTP_REFUSAL})] * 25
    assert set(refusals[1]) == {(grpc.StatusCode.INVALID_ARGUMENT, grpc_front_refusal(server))}
    assert set(refusals[2]) == {(grpc.StatusCode.INVALID_ARGUMENT, REFUSAL)}
    answers, code, details = streamed_refusal(server, [True] * 3)
    assert set(refusals[3]) == {(tuple(answers), code, details)}
    assert server.process.poll() is None and server.process.pid == pid
