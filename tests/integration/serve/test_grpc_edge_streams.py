"""Damaged ModelStreamInfer streams through the gRPC front inside tritonserver: requests with one absurd part, bytes
damaged on the way, messages protobuf cannot parse, mixed into streams of valid requests to risk_pipeline and to
risk_stream (a decoupled model).

Relayed byte for byte, such streams made tritonserver 2.51 abort (`proto_buffer_writer.h:65 ASSERTION FAILED:
!byte_buffer->Valid()`) within the first few dozen: what reaches the assertion is a stream to a decoupled model
carrying a request Triton takes as a non-decoupled model's (one for a model it does not have, a damaged model name):
its stream handler then writes the two kinds of answer by two paths at once. A stream whose message did not parse
ended OK with the rest of its requests unanswered, or never ended. Through the front every stream ends, within its deadline, one of two ways: OK
with an answer (a result or Triton's error) for every request it carried, or INVALID_ARGUMENT naming what was wrong
with the message the front refused, after the answers to the requests before it. The same tritonserver throughout."""
from __future__ import annotations

import json
import random
import threading
import time
from concurrent import futures

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
STREAMS, MAX_MESSAGES, CALLERS = 300, 30, 6
STREAM_DEADLINE_S = 60


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("grpc_edge_streams") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:32]]


def pipeline_request(payload: bytes, place: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="risk_pipeline", id=f"m{place}")
    request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(payload).to_bytes(4, "little") + payload)
    return request


def sequence_request(payload: bytes, place: int, sequence: int) -> service_pb2.ModelInferRequest:
    """One record of a risk_stream sequence (decoupled: one answer for each request)."""
    request = pipeline_request(payload, place)
    request.model_name = "risk_stream"
    request.parameters["sequence_id"].int64_param = sequence
    request.parameters["sequence_start"].bool_param = place == 0
    return request


def absurd(request: service_pb2.ModelInferRequest, rng: random.Random) -> service_pb2.ModelInferRequest:
    """One part of `request` made absurd, as a hostile or broken client sends it."""
    way = rng.randrange(8)
    if way == 0:
        request.inputs[0].shape[:] = [1 << 40, 1 << 30]
    elif way == 1:
        request.inputs[0].shape[:] = [-1, 1]
    elif way == 2:
        request.inputs[0].shape[:] = [1] * 200
    elif way == 3:
        for k in range(300):
            request.inputs.add(name=f"extra{k}", datatype="FP32", shape=[1])
    elif way == 4:
        request.outputs.add(name="no_such_output")
    elif way == 5:
        request.parameters["sequence_start"].string_param = "yes"
    elif way == 6:
        request.inputs[0].datatype = "NO_SUCH_TYPE"
    else:
        request.model_name = "no_such_model"
    return request


def damaged(serialized: bytes, rng: random.Random) -> bytes:
    data = bytearray(serialized)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def unparseable(serialized: bytes, rng: random.Random) -> bytes:
    """Bytes no protobuf library reads as a ModelInferRequest: cut inside a field, or a field of wire type 7."""
    if rng.random() < 0.5:
        return serialized[:rng.randrange(3, len(serialized) - 1)]
    return serialized + b"\x0f\x01"


def stream_messages(records: list[bytes], rng: random.Random, sequence: int) -> tuple[list[bytes], list[str]]:
    """1-MAX_MESSAGES messages to risk_pipeline or to risk_stream, each valid, absurd, damaged or unparseable (which
    of these, for each)."""
    messages, kinds = [], []
    decoupled = rng.random() < 0.5
    for place in range(rng.randint(1, MAX_MESSAGES)):
        request = sequence_request(rng.choice(records), place, sequence) if decoupled else \
            pipeline_request(rng.choice(records), place)
        kind = rng.choices(("valid", "absurd", "damaged", "unparseable"), (6, 2, 1, 1))[0]
        if kind == "valid":
            messages.append(request.SerializeToString())
        elif kind == "absurd":
            messages.append(absurd(request, rng).SerializeToString())
        elif kind == "damaged":
            messages.append(damaged(request.SerializeToString(), rng))
        else:
            messages.append(unparseable(request.SerializeToString(), rng))
        kinds.append(kind)
    return messages, kinds


def run_stream(url: str, messages: list[bytes]) -> tuple[str, str, int]:
    """(status code name, details, answers received) of one stream that sends `messages` and half-closes."""
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream(STREAM_INFER)(iter(messages), timeout=STREAM_DEADLINE_S)
        answers = 0
        try:
            for _ in call:
                answers += 1
            return "OK", "", answers
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", answers


def test_damaged_streams_beside_valid_ones_each_end_answered_or_refused_and_the_server_stays(server, records):
    pid = server.process.pid
    rng_lock, wrong, outcomes = threading.Lock(), [], {"complete": 0, "refused": 0}
    seeds = iter(range(STREAMS))

    def caller() -> None:
        while True:
            with rng_lock:
                seed = next(seeds, None)
            if seed is None or server.process.poll() is not None:
                return
            messages, kinds = stream_messages(records, random.Random(seed), 1000 + seed)
            code, details, answers = run_stream(server.grpc_url, messages)
            with rng_lock:
                if code == "OK" and answers == len(messages):
                    outcomes["complete"] += 1
                elif code == "INVALID_ARGUMENT" and answers < len(messages) and details:
                    outcomes["refused"] += 1
                else:
                    wrong.append((seed, code, details[:200], answers, len(messages), kinds))

    with futures.ThreadPoolExecutor(CALLERS) as pool:
        for each in [pool.submit(caller) for _ in range(CALLERS)]:
            each.result()
    assert server.process.poll() is None and server.process.pid == pid, "tritonserver died"
    assert wrong == [], wrong[:5]
    assert outcomes["complete"] > 10 and outcomes["refused"] > 100, outcomes


def test_a_stream_message_that_does_not_parse_ends_the_stream_invalid_argument_after_the_answers_before_it(
        server, records):
    valid = [pipeline_request(records[i], i).SerializeToString() for i in range(3)]
    code, details, answers = run_stream(server.grpc_url, valid + [valid[0][:-3]] + valid)
    assert (code, answers) == ("INVALID_ARGUMENT", 3), (code, details, answers)
    assert "message 4" in details and "ModelInferRequest" in details, details


@pytest.mark.parametrize("change, field", [
    (lambda r: r.inputs[0].shape.__setitem__(slice(None), [-1, 1]), "inputs[0].shape"),
    (lambda r: r.inputs[0].shape.__setitem__(slice(None), [1 << 40, 1 << 30]), "inputs[0].shape"),
    (lambda r: r.parameters["sequence_start"].__setattr__("string_param", "yes"), "parameters['sequence_start']"),
    (lambda r: r.outputs.add(name="probability").parameters["no_such"].__setattr__("int64_param", 1),
     "outputs[0].parameters['no_such']"),
])
def test_a_stream_message_that_fails_a_check_ends_the_stream_invalid_argument_naming_the_field(
        server, records, change, field):
    bad = pipeline_request(records[1], 1)
    change(bad)
    code, details, answers = run_stream(server.grpc_url, [pipeline_request(records[0], 0).SerializeToString(),
                                                          bad.SerializeToString()])
    assert (code, answers) == ("INVALID_ARGUMENT", 1), (code, details, answers)
    assert field in details and "message 2" in details, details


def test_a_decoupled_models_stream_refuses_a_request_triton_would_answer_by_its_other_path(server, records):
    """A request for a model Triton does not have, in a stream to risk_stream: relayed, it aborted tritonserver."""
    first = sequence_request(records[0], 0, 77).SerializeToString()
    stray = pipeline_request(records[1], 1)
    stray.model_name = "no_such_model"
    code, details, answers = run_stream(server.grpc_url, [first, stray.SerializeToString()])
    assert (code, answers) == ("INVALID_ARGUMENT", 1), (code, details, answers)
    assert "message 2" in details and "model_name: 'no_such_model'" in details, details
    assert server.process.poll() is None


def test_what_the_front_relays_is_reserialised_so_a_valid_stream_is_answered_in_full(server, records):
    """Unknown fields and a duplicated model name (the last wins, as protobuf reads it) reach Triton as one clean
    message."""
    request = pipeline_request(records[0], 0)
    extra = request.SerializeToString() + b"\xf8\x07\x01"  # field 127, a varint: unknown to Triton
    twice = service_pb2.ModelInferRequest(model_name="no_such_model").SerializeToString() + \
        pipeline_request(records[1], 1).SerializeToString()
    started = time.monotonic()
    code, details, answers = run_stream(server.grpc_url, [extra, twice])
    assert (code, answers) == ("OK", 2), (code, details)
    assert time.monotonic() - started < STREAM_DEADLINE_S


def test_a_stream_in_tritons_grpc_error_mode_is_refused_naming_the_metadata(server):
    """Relayed, two such streams with failing requests crash tritonserver 2.51 (its error mode frees the stream's
    state while its other requests are in flight)."""
    from tests.integration.serve.triton_crash_requests import GRPC_CRASHES
    crash = next(c for c in GRPC_CRASHES if c.name == "stream_in_triton_grpc_error_mode_with_failing_requests")
    for _ in range(2):
        with grpc.insecure_channel(server.grpc_url) as channel:
            call = channel.stream_stream(crash.method)(iter([r.SerializeToString() for r in crash.requests()]),
                                                       metadata=crash.metadata, timeout=STREAM_DEADLINE_S)
            with pytest.raises(grpc.RpcError) as refused:
                list(call)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'triton_grpc_error'" in refused.value.details()
    assert server.process.poll() is None
