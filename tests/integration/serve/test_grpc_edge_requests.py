"""What a ModelInfer caller can send through the gRPC front inside tritonserver, at its edge: protobuf that the
protobuf library refuses, requests that fail a check before Triton sees them (each refused INVALID_ARGUMENT naming
the field), a classification of a BYTES output (which ends tritonserver 2.51 with SIGFPE), counts that would make
the front's thread build a million objects, custom request parameters (those a served model reads passed through to
it, any other refused naming it, as the HTTP front refuses it), and a refusal at submission (answered with Triton's error, not tried again through Triton's endpoint). Each
beside valid callers; the same tritonserver throughout."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import requests
from tritonclient.grpc import service_pb2

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    """Triton's verbose log names each request its own gRPC endpoint fails ("Infer failed")."""
    log = tmp_path_factory.mktemp("grpc_edge_requests") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log, extra_args=["--log-verbose=1"])) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:16]]


def pipeline_request(payloads: list[bytes], model: str = "risk_pipeline", **fields) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    request.inputs.add(name="payload", datatype="BYTES", shape=[len(payloads), 1])
    request.raw_input_contents.append(b"".join(len(p).to_bytes(4, "little") + p for p in payloads))
    return request


def call(url: str, request: service_pb2.ModelInferRequest | bytes, timeout: float = 30) -> tuple:
    """(status code name, details, the answer or None) of one ModelInfer sent as raw bytes."""
    data = request if isinstance(request, bytes) else request.SerializeToString()
    with grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1)]) as channel:
        try:
            answer = channel.unary_unary(INFER)(data, timeout=timeout)
            return "OK", "", service_pb2.ModelInferResponse.FromString(answer)
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", None


def valid_calls(server, records: list[bytes], stop: float, wrong: list) -> Callable[[], int]:
    """A valid caller to run beside an attack until `stop` (monotonic): it returns how many calls it made, and puts
    in `wrong` each answer that differs from Triton's own endpoint's to the same request."""
    expected = call(server.triton_grpc_url, pipeline_request(records[:1], id="v"))[2]

    def valid() -> int:
        answered = 0
        while time.monotonic() < stop:
            got = call(server.grpc_url, pipeline_request(records[:1], id="v"))
            if got[2] != expected:
                wrong.append(got[:2])
            answered += 1
        return answered
    return valid


def varint(value: int, length: int | None = None) -> bytes:
    """`value` as a protobuf varint, written in `length` bytes (more than it needs: overlong) when given."""
    out = bytearray()
    while True:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
        if not value and (length is None or len(out) >= length):
            break
    out[-1] &= 0x7F
    return bytes(out)


def overlong(request: service_pb2.ModelInferRequest, where: str) -> bytes:
    """`request` with its model_name field's tag or length written as a six-byte varint: protobuf reads a tag of at
    most five bytes and a length of at most five."""
    data = request.SerializeToString()
    name = request.model_name.encode()
    field = b"\x0a" + varint(len(name)) + name
    assert data.startswith(field)
    if where == "tag":
        return varint(0x0A, 6) + varint(len(name)) + name + data[len(field):]
    return b"\x0a" + varint(len(name), 6) + name + data[len(field):]


def test_protobuf_that_the_protobuf_library_refuses_is_refused_as_tritons_endpoint_refuses_it(server, records):
    valid = pipeline_request(records[:1])
    not_utf8 = pipeline_request(records[:1], id="XX").SerializeToString().replace(b"\x1a\x02XX", b"\x1a\x02\xff\xfe")
    cases = {"a tag written as an overlong varint": overlong(valid, "tag"),
             "a length written as an overlong varint": overlong(valid, "length"),
             "an id that is not UTF-8": not_utf8}
    for name, data in cases.items():
        triton, ours = call(server.triton_grpc_url, data), call(server.grpc_url, data)
        assert triton[0] != "OK", (name, triton)
        assert ours[0] == "INVALID_ARGUMENT" and "ModelInferRequest" in ours[1], (name, ours)
    assert "inference.ModelInferRequest.id" in call(server.grpc_url, not_utf8)[1]


def _change(request: service_pb2.ModelInferRequest, what: str) -> None:
    if what == "negative dim":
        request.inputs[0].shape[:] = [-1, 1]
    elif what == "overflowing dims":
        request.inputs[0].shape[:] = [1 << 40, 1 << 30]
    elif what == "rank 33":
        request.inputs[0].shape[:] = [1] * 33
    elif what == "a shape the model does not take":
        request.inputs[0].shape[:] = [1, 2]
    elif what == "a batch past the model's largest":
        request.inputs[0].shape[:] = [300, 1]
    elif what == "more inputs than the model has":
        for k in range(2):
            request.inputs.add(name=f"extra{k}", datatype="FP32", shape=[1, 1])
    elif what == "more outputs than the model has":
        for name in ("probability", "decision", "probability"):
            request.outputs.add(name=name)
    elif what == "a datatype Triton does not have":
        request.inputs[0].datatype = "FLOAT"
    elif what == "sequence_start as a string":
        request.parameters["sequence_start"].string_param = "yes"
    elif what == "a reserved triton_ key":
        request.parameters["triton_max_tokens"].int64_param = 5
    elif what == "a custom uint64":
        request.parameters["route"].uint64_param = 5
    elif what == "an unknown output parameter":
        request.outputs.add(name="probability").parameters["binary"].bool_param = True
    elif what == "a classification count of 0":
        request.outputs.add(name="probability").parameters["classification"].int64_param = 0
    else:
        raise AssertionError(what)


CHECKS = {"negative dim": "inputs[0].shape", "overflowing dims": "inputs[0].shape", "rank 33": "inputs[0].shape",
          "a shape the model does not take": "inputs[0].shape", "a batch past the model's largest": "inputs[0].shape",
          "more inputs than the model has": "inputs:", "more outputs than the model has": "outputs:",
          "a datatype Triton does not have": "inputs[0].datatype",
          "sequence_start as a string": "parameters['sequence_start']",
          "a reserved triton_ key": "parameters['triton_max_tokens']", "a custom uint64": "parameters['route']",
          "an unknown output parameter": "outputs[0].parameters['binary']",
          "a classification count of 0": "outputs[0].parameters['classification']"}


@pytest.mark.parametrize("what", CHECKS)
def test_a_request_that_fails_a_check_is_refused_invalid_argument_naming_the_field(server, records, what):
    request = pipeline_request(records[:1])
    _change(request, what)
    code, details, _ = call(server.grpc_url, request)
    assert code == "INVALID_ARGUMENT" and CHECKS[what] in details, (code, details)


def test_a_classification_of_a_bytes_output_is_refused_naming_it_beside_valid_callers(server, records):
    """Sent to Triton's own endpoint, this request ends tritonserver 2.51 (SIGFPE): here it is refused, again and
    again, while valid callers are answered; a classification of the FP32 output is answered as Triton answers it."""
    numeric = pipeline_request(records[:2])
    numeric.outputs.add(name="probability").parameters["classification"].int64_param = 1
    ours, triton = call(server.grpc_url, numeric), call(server.triton_grpc_url, numeric)
    assert ours[0] == "OK" and ours == triton
    bytes_output = pipeline_request(records[:1])
    bytes_output.outputs.add(name="decision").parameters["classification"].int64_param = 5
    pid, stop, wrong = server.process.pid, time.monotonic() + 4, []
    valid = valid_calls(server, records, stop, wrong)

    def hostile() -> int:
        refused = 0
        while time.monotonic() < stop:
            code, details, _ = call(server.grpc_url, bytes_output)
            if code != "INVALID_ARGUMENT" or "outputs[0].parameters['classification']" not in details \
                    or "'decision'" not in details:
                wrong.append((code, details))
            refused += 1
        return refused

    with futures.ThreadPoolExecutor(4) as pool:
        answered = [pool.submit(valid) for _ in range(2)]
        refused = [pool.submit(hostile) for _ in range(2)]
        counts = [f.result() for f in answered], [f.result() for f in refused]
    assert wrong == [], wrong[:3]
    assert min(counts[0]) > 10 and min(counts[1]) > 10, counts
    assert server.process.poll() is None and server.process.pid == pid


def test_a_million_inputs_or_16m_packed_dims_are_refused_by_their_counts_while_others_are_answered(server, records):
    """Counted from the message's tags before protobuf builds it: neither a million input objects nor a vector of
    16 M dims is made on the front's thread, and valid callers beside are answered meanwhile."""
    head = b"\x0a\x0drisk_pipeline"
    million = head + b"\x2a\x00" * 1_000_000
    dims = b"\x1a" + varint(16_000_000) + b"\x01" * 16_000_000
    packed = head + b"\x2a" + varint(len(dims) + 3) + b"\x0a\x01x" + dims
    expected = call(server.triton_grpc_url, pipeline_request(records[:1], id="v"))[2]
    pid, done, slowest, wrong = server.process.pid, threading.Event(), [0.0], []

    def valid() -> None:
        while not done.is_set():
            began = time.monotonic()
            got = call(server.grpc_url, pipeline_request(records[:1], id="v"))
            slowest[0] = max(slowest[0], time.monotonic() - began)
            if got[2] != expected:
                wrong.append(got[:2])

    with futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(valid)
        try:
            for data, field in ((million, "inputs: 257 given"), (packed, "inputs[0].shape: 16000000 given")) * 3:
                code, details, _ = call(server.grpc_url, data)
                assert code == "INVALID_ARGUMENT" and field in details, (code, details[:200])
        finally:
            done.set()
            beside.result()
    assert wrong == [], wrong[:3]
    assert slowest[0] < 5, slowest
    assert server.process.poll() is None and server.process.pid == pid


def test_custom_request_parameters_reach_the_model_as_through_tritons_endpoint(server, records):
    """risk_router reads its `route` parameter: a route it does not serve is its own refusal, the same both ways."""
    request = pipeline_request(records[:1], model="risk_router")
    request.parameters["route"].string_param = "nowhere"
    ours, triton = call(server.grpc_url, request), call(server.triton_grpc_url, request)
    assert ours[0] != "OK" and "route" in ours[1], ours
    assert ours == triton


def test_a_custom_parameter_no_served_model_reads_is_refused_naming_it_on_both_fronts(server, records):
    """One rule for both public fronts: Triton's own parameters and the custom ones a served model reads pass; any
    other custom key is refused naming it (INVALID_ARGUMENT here, 400 from the HTTP front), beside valid callers."""
    pid, stop, wrong = server.process.pid, time.monotonic() + 3, []
    valid = valid_calls(server, records, stop, wrong)

    with futures.ThreadPoolExecutor(1) as pool:
        beside = pool.submit(valid)
        while time.monotonic() < stop:
            for key, value in (("colour", "blue"), ("binary_data_output", "x"), ("Route", "a"), ("sequence_foo", "x")):
                request = pipeline_request(records[:1])
                request.parameters[key].string_param = value
                code, details, _ = call(server.grpc_url, request)
                assert code == "INVALID_ARGUMENT" and details.startswith(
                    f"parameters['{key}']: not a parameter of the protocol nor one the served models read (route)"), \
                    (code, details)
        assert beside.result() > 5
    for key in ("colour", "sequence_foo"):
        answer = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/risk_pipeline/infer",
                               json={"parameters": {key: "blue"}, "inputs": [
                                   {"name": "payload", "datatype": "BYTES", "shape": [1, 1],
                                    "data": [records[0].decode()]}]}, timeout=30)
        assert answer.status_code == 400 and f"parameters.{key}: not a parameter of the protocol nor one the " \
            "served models read (route)" in answer.json()["error"], answer.text
    request = pipeline_request(records[:1], model="risk_router")
    request.parameters["route"].string_param = "nowhere"
    # Read by risk_router, which refuses a route to no scorer in its own words: the same answer as Triton's own
    # endpoint gives, not the front's refusal of an unknown parameter.
    ours, tritons = call(server.grpc_url, request), call(server.triton_grpc_url, request)
    assert ours[:2] == tritons[:2] and "nowhere" in ours[1] and "not a parameter" not in ours[1], (ours, tritons)
    assert wrong == [], wrong[:3]
    assert server.process.poll() is None and server.process.pid == pid


def test_a_refusal_at_submission_is_tritons_error_and_not_tried_again_through_its_endpoint(server, records):
    """A request Triton refuses when it is submitted (an input its model does not have) is answered with Triton's
    code and words, and Triton's own endpoint, which says in its verbose log each request it fails, never sees it:
    the one line for the id is the call made to that endpoint directly."""
    request = pipeline_request(records[:1], id="refused-at-submission")
    request.inputs[0].name = "record"
    ours, triton = call(server.grpc_url, request), call(server.triton_grpc_url, request)
    assert ours[0] == "INVALID_ARGUMENT" and ours == triton, (ours, triton)
    line = "[request id: refused-at-submission] Infer failed"
    deadline = time.monotonic() + 10
    while Path(server.log_path).read_text().count(line) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert Path(server.log_path).read_text().count(line) == 1
