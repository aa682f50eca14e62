"""The served gRPC port (the front inside tritonserver) under generated hostile requests (s2t/gate/hostile_requests.py):
ModelInferRequest messages built with Triton's generated classes, their serialized bytes damaged, sent unary through
a raw channel and as ModelStreamInfer streams, while four callers send valid requests beside them. Every valid answer
is the one a quiet server gave, every request that must be refused is refused, none is dropped, the same
tritonserver serves to the end; and where Triton's own answer is defined, Triton's own endpoint (on loopback) gives
the same class of answer (answered, or refused) for the same bytes. A failure names the request by its seed and
index: `grpc_request(models, records, SEED, index)` makes it again."""
from __future__ import annotations

import collections
import re
import threading
import time

import grpc
import pytest
from tritonclient.grpc import service_pb2

from s2t.gate.hostile_requests import grpc_request, grpc_stream
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.edge.grpc_messages import text, wire
from tests.integration.edge.served_models import fuzzed_models, valid_records
from tests.integration.servers import serving, triton_server

SEED = 20261206
REQUESTS = 2000
STREAMS = 60
BUDGET_S = 110  # the fuzzer's share of a test; its requests stop here even if some are left
VALID_CALLERS = 4
TIMEOUT_S = 30
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
# A call that never reached an answer: the server died, hung or hung up.
DROPPED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
EXPIRED = "Request timeout expired"


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz_grpc") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[bytes]:
    return valid_records(german_credit_data, 16)


def call(infer, data: bytes) -> tuple[str, str, bytes]:
    """(outcome, status code name, the answer's bytes or the refusal's words): answered, refused or dropped."""
    try:
        return "answered", "OK", infer(data, timeout=TIMEOUT_S)
    except grpc.RpcError as err:
        return outcome_of(err), err.code().name, (err.details() or "").encode()


def outcome_of(err: grpc.RpcError) -> str:
    # A request whose own `timeout` parameter expired in the queue is refused by Triton with UNAVAILABLE: an answer
    # to what the caller asked, not a call the server dropped.
    if err.code() == grpc.StatusCode.UNAVAILABLE and err.details() == EXPIRED:
        return "refused"
    return "dropped" if err.code() in DROPPED else "refused"


def stream_call(channel: grpc.Channel, messages: list[bytes]) -> tuple[str, str, int, int]:
    """(outcome, final status code name, answers, error messages) of one ModelStreamInfer stream."""
    answers = errors = 0
    try:
        for data in channel.stream_stream(STREAM_INFER)(iter(messages), timeout=TIMEOUT_S):
            response = service_pb2.ModelStreamInferResponse.FromString(data)
            answers += 1
            errors += bool(response.error_message)
        return "answered", "OK", answers, errors
    except grpc.RpcError as err:
        return outcome_of(err), err.code().name, answers, errors


def pipeline_request(record: bytes, request_id: str) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="risk_pipeline", id=request_id)
    request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(record).to_bytes(4, "little") + record)
    return request.SerializeToString()


class ValidTraffic:
    """Callers sending valid requests until stopped, each answer compared with a quiet server's."""

    def __init__(self, url: str, records: list[bytes]):
        with grpc.insecure_channel(url) as channel:
            infer = channel.unary_unary(INFER)
            self.expected = {i: infer(pipeline_request(r, str(i)), timeout=TIMEOUT_S) for i, r in enumerate(records)}
        self.url, self.records, self.done = url, records, threading.Event()
        self.wrong: list = []
        self.counts = collections.Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n * 4,)) for n in range(VALID_CALLERS)]

    def _run(self, offset: int) -> None:
        with grpc.insecure_channel(self.url) as channel:
            infer, i = channel.unary_unary(INFER), offset
            while not self.done.is_set():
                i = (i + 1) % len(self.records)
                outcome, code, answer = call(infer, pipeline_request(self.records[i], str(i)))
                with self.lock:
                    self.counts[outcome] += 1
                    if answer != self.expected[i]:
                        self.wrong.append((i, code, answer[:300]))

    def __enter__(self) -> "ValidTraffic":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join()


# The fields the front's edge checks name when it refuses what Triton 2.51 would take: more outputs than the model
# has, output parameters Triton does not know, Triton's own request parameters of another type, parameter keys
# past their bounds. Such a refusal is the edge's policy (INVALID_ARGUMENT naming the field), not a divergence.
EDGE_FIELDS = re.compile(r"^(outputs|parameters|inputs)\b")


def edge_refusal(code: str, words: bytes) -> bool:
    return code == "INVALID_ARGUMENT" and EDGE_FIELDS.match(words.decode(errors="replace")) is not None


def verdict(request_refused: bool, ours: str, theirs: str | None, edge: bool = False) -> str | None:
    """What is wrong with the front's outcome `ours` (and Triton's own `theirs`, None where not asked); `edge`: the
    front's refusal is one of its own edge checks, naming the field."""
    if ours == "dropped":
        return "dropped"
    if request_refused and ours == "answered":
        return "answered a request that must be refused"
    if theirs == "dropped":
        return "Triton's own endpoint dropped it"
    if request_refused and ours == "refused":
        return None  # where Triton answers what must be refused (a shape past int64's elements), the front is right
    if ours == "refused" and theirs == "answered" and edge:
        return None
    if theirs is not None and theirs != ours:
        return f"the front {ours}, Triton's own endpoint {theirs}"
    return None


def stream_difference(ours: tuple[str, int, int], theirs: tuple[str, int, int], messages: int) -> str | None:
    """What differs between the front's end of a stream and Triton's own, each (outcome, answers, errors). The front
    ends a stream INVALID_ARGUMENT at the first message it refuses, after the answers to those before it, where
    Triton answers that message with an error in the stream: the same stream refused something either way. Where
    Triton's own stream ends OK before answering every message (a message its parser could not read ends its stream
    silently), its answer is no reference."""
    if theirs[0] == "dropped":
        return "Triton's own endpoint dropped it"
    if theirs[0] == "answered" and theirs[1] != messages:
        return None
    refused_something = (ours[0] == "refused" or ours[2] > 0, theirs[0] == "refused" or theirs[2] > 0)
    if refused_something[0] != refused_something[1]:
        return f"the front {'refused' if refused_something[0] else 'answered'} it, Triton's own endpoint " \
               f"{'refused' if refused_something[1] else 'answered'} it (front {ours}, Triton {theirs})"
    if ours[0] == theirs[0] == "answered" and ours[1:] != theirs[1:]:
        return f"(answers, errors) {ours[1:]} from the front, {theirs[1:]} from Triton's own endpoint"
    return None


def report(title: str, sent: int, outcomes, by_kind, failures, extra: str = "") -> None:
    print(f"\n{title}, seed {SEED}: {sent} sent: {dict(outcomes)}{extra}")
    for (kind, wrong), n in by_kind.most_common():
        print(f"  {n:5d} {wrong}: {kind}")
    for line in failures[:20]:
        print("  " + line)


def test_the_messages_are_built_with_tritons_classes_and_damaged_per_seed(records):
    models = fuzzed_models()
    for index in range(300):
        request = grpc_request(models, records, SEED, index)
        data = wire(request)
        assert data == wire(grpc_request(models, records, SEED, index))
        if request.damage is None:
            parsed = service_pb2.ModelInferRequest.FromString(data)
            assert parsed.model_name == text(request.spec["model_name"])
            assert len(parsed.raw_input_contents) == len(request.spec["raw_input_contents"])


def test_hostile_grpc_requests_beside_valid_traffic_are_refused_alone_as_triton_refuses_them(server, records):
    models = fuzzed_models()
    pid = server.process.pid
    outcomes, codes, by_kind, failures = collections.Counter(), collections.Counter(), collections.Counter(), []
    triton_answered, stricter = collections.Counter(), collections.Counter()
    sent, deadline = 0, time.monotonic() + BUDGET_S
    with ValidTraffic(server.grpc_url, records) as valid, grpc.insecure_channel(server.grpc_url) as front_channel, \
            grpc.insecure_channel(server.triton_grpc_url) as triton_channel:
        front, triton = front_channel.unary_unary(INFER), triton_channel.unary_unary(INFER)
        for index in range(REQUESTS):
            if time.monotonic() > deadline or server.process.poll() is not None:
                break
            request = grpc_request(models, records, SEED, index)
            data = wire(request)
            ours, our_code, our_words = call(front, data)
            theirs, their_code = None, None
            if request.triton_defined and ours != "dropped" and server.process.poll() is None:
                theirs, their_code, _ = call(triton, data)
            sent += 1
            outcomes[ours] += 1
            if their_code and their_code != our_code:
                codes[(our_code, their_code)] += 1
            if request.refused and theirs == "answered":
                triton_answered[request.kind.split(" + ")[0]] += 1
            edge = edge_refusal(our_code, our_words)
            if edge and theirs == "answered":
                stricter[request.kind.split(" + ")[0]] += 1
            wrong = verdict(request.refused, ours, theirs, edge)
            if wrong:
                by_kind[(request.kind.split(" + ")[0], wrong)] += 1
                failures.append(f"index {index} ({request.kind}): {wrong} ({our_code} / {their_code})")
    alive = server.process.poll() is None
    report("gRPC unary fuzz", sent, outcomes, by_kind, failures,
           f"; codes that differ (front, Triton): {dict(codes)}; Triton's own endpoint answered what must be "
           f"refused: {dict(triton_answered)}; refused by the edge's own checks where Triton answers: "
           f"{dict(stricter)}; valid traffic: {dict(valid.counts)}")
    assert alive and server.process.pid == pid, (
        f"tritonserver died (exit {server.process.returncode}) after request index {sent - 1}: {failures[-1:]}")
    assert failures == [], f"{len(failures)} of {sent} hostile requests answered wrongly; first: {failures[:5]}"
    assert valid.wrong == [], f"{len(valid.wrong)} valid requests failed; first: {valid.wrong[:5]}"
    assert sent == REQUESTS, f"only {sent} of {REQUESTS} requests within {BUDGET_S} s"


def test_hostile_streams_beside_valid_traffic_end_as_tritons_own_streams_end(server, records):
    """A stream that ends OK answered each of its messages once; one that must refuse a message carries an error
    for it; none is dropped; Triton's own endpoint ends the same stream the same way."""
    models = fuzzed_models()
    pid = server.process.pid
    outcomes, by_kind, failures = collections.Counter(), collections.Counter(), []
    sent, messages, deadline = 0, 0, time.monotonic() + BUDGET_S
    with ValidTraffic(server.grpc_url, records) as valid, grpc.insecure_channel(server.grpc_url) as front_channel, \
            grpc.insecure_channel(server.triton_grpc_url) as triton_channel:
        for index in range(STREAMS):
            if time.monotonic() > deadline or server.process.poll() is not None:
                break
            stream = grpc_stream(models, records, SEED, index)
            data = [wire(r) for r in stream.requests]
            must_refuse = sum(r.refused for r in stream.requests)
            ours, our_code, answers, errors = stream_call(front_channel, data)
            wrong = "dropped" if ours == "dropped" else None
            if not wrong and ours == "answered" and answers != len(data):
                wrong = f"{answers} answers to {len(data)} messages"
            if not wrong and ours == "answered" and errors < must_refuse:
                wrong = f"{errors} errors for {must_refuse} messages that must be refused"
            if not wrong and all(r.triton_defined for r in stream.requests) and server.process.poll() is None:
                theirs, _, their_answers, their_errors = stream_call(triton_channel, data)
                wrong = stream_difference((ours, answers, errors), (theirs, their_answers, their_errors), len(data))
            sent, messages = sent + 1, messages + len(data)
            outcomes[ours] += 1
            if wrong:
                kinds = sorted({r.kind.split(" + ")[0] for r in stream.requests if r.refused or r.damage})
                by_kind[(stream.kind, wrong)] += 1
                failures.append(f"stream {index} ({stream.kind}: {', '.join(kinds)[:300]}): {wrong} ({our_code})")
    alive = server.process.poll() is None
    report("gRPC stream fuzz", sent, outcomes, by_kind, failures,
           f" ({messages} messages); valid traffic: {dict(valid.counts)}")
    assert alive and server.process.pid == pid, (
        f"tritonserver died (exit {server.process.returncode}) after stream {sent - 1}: {failures[-1:]}")
    assert failures == [], f"{len(failures)} of {sent} hostile streams ended wrongly; first: {failures[:5]}"
    assert valid.wrong == [], f"{len(valid.wrong)} valid requests failed; first: {valid.wrong[:5]}"
    assert sent == STREAMS, f"only {sent} of {STREAMS} streams within {BUDGET_S} s"
