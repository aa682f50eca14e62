"""The wire-level attacks of the hostile soak, on their own: the requests are made again from their seed, each is
what its name says, and the counts become a verdict that holds only when every request came back as it must."""
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from s2t.gate import hostile_requests
from s2t.soak.hostile import report as soak_report
from s2t.soak.hostile import wire_attacks
from s2t.soak.hostile.report import ANSWERED, Sample
from s2t.soak.hostile.wire_attacks import Attempt

RECORDS = [{"duration_in_month": 12, "credit_history": "critical"}, {"duration_in_month": 24, "credit_history": "ok"}]


def parses(data: bytes) -> bool:
    try:
        service_pb2.ModelInferRequest.FromString(data)
    except DecodeError:
        return False
    return True


def test_the_classification_request_asks_for_the_classes_of_the_bytes_output():
    message = wire_attacks.infer_message(b'{"features": {}}', "r-1", classify=True)
    [output] = message.outputs
    assert (output.name, output.parameters["classification"].int64_param) == ("decision", 5)
    assert message.model_name == "risk_pipeline" and message.raw_input_contents[0][4:] == b'{"features": {}}'


@pytest.mark.parametrize("k", range(12))
def test_damaged_streams_are_made_again_from_their_seed_and_damaged_as_their_turn_says(k):
    messages, sure, what = wire_attacks.damaged_stream(RECORDS, seed=7, k=k)
    assert wire_attacks.damaged_stream(RECORDS, seed=7, k=k) == (messages, sure, what)
    assert 1 <= len(messages) <= 30
    plain = [wire_attacks.infer_message(b"x").SerializeToString()]
    way = wire_attacks.STREAM_DAMAGE[k % 3]
    if way == "unparseable messages":
        assert not sure and not all(parses(m) for m in messages), what
    elif way == "one absurd part":
        # Every message parses; one of them asks for what no buffer holds.
        assert sure and all(parses(m) for m in messages), what
        absurd = [service_pb2.ModelInferRequest.FromString(m) for m in messages]
        assert sum(any(abs(d) >= 2**31 or d < 0 for d in m.inputs[0].shape)
                   or int.from_bytes(m.raw_input_contents[0][:4], "little") == 0xFFFFFFFF for m in absurd) == 1
    else:
        assert sure == all(parses(m) for m in messages)
    assert messages != plain


def test_overlong_varints_decode_to_the_plain_message_within_ten_bytes_and_not_past_them():
    seen = set()
    for k in range(24):
        name, data, plain, must = wire_attacks.overlong_varint_request(RECORDS, seed=3, k=k)
        seen.add(name)
        assert data != plain
        if name == "varint past 10 bytes":
            assert must == hostile_requests.REFUSE and not parses(data)
        elif name in ("overlong tag within 5 bytes", "overlong length within 5 bytes"):
            # Python's protobuf reads them as the message they pad: a server must answer them so.
            assert must == hostile_requests.SAME
            assert service_pb2.ModelInferRequest.FromString(data) == service_pb2.ModelInferRequest.FromString(plain)
    assert seen == set(wire_attacks.OVERLONG_DAMAGE)


@pytest.mark.parametrize("attempts, holds, in_detail", [
    ([Attempt("hostile", "gRPC: INVALID_ARGUMENT", True), Attempt("valid", "valid gRPC: OK", True)], True,
     "(1 hostile, 1 valid)"),
    ([Attempt("hostile", "gRPC: UNAVAILABLE", False), Attempt("valid", "valid gRPC: OK", True)], False,
     "1 of 1 hostile requests not as they must be: gRPC: UNAVAILABLE"),
    ([Attempt("hostile", "gRPC: INVALID_ARGUMENT", True), Attempt("valid", "valid after it: INVALID_ARGUMENT", False)],
     False, "1 of 1 valid requests"),
    ([Attempt("hostile", "HTTP: no answer", False, answered=False), Attempt("valid", "ok", True)], False,
     "1 unanswered"),
    ([Attempt("hostile", "gRPC: INVALID_ARGUMENT", True)], False, "no valid request beside it"),
])
def test_a_wire_attack_holds_only_when_every_hostile_and_valid_request_came_back_as_it_must(attempts, holds,
                                                                                           in_detail):
    verdict = soak_report.flood_answered_alone(wire_attacks.tally(attempts), "refused alone")
    assert verdict["holds"] is holds and in_detail in verdict["detail"], verdict


def test_a_wire_attack_not_run_or_that_sent_nothing_is_not_measured():
    assert soak_report.flood_answered_alone(None, "x")["holds"] is None
    assert soak_report.flood_answered_alone({"sent": 0, "outcomes": {"flood client failed": 1}}, "x")["holds"] is None


def test_the_timeline_tells_a_burst_from_a_queue_by_when_requests_were_sent():
    burst = [Sample("during", ANSWERED, 0.01, at_s=t / 10) for t in range(300)]
    burst += [Sample("during", ANSWERED, 1.5, at_s=10.2), Sample("during", ANSWERED, 1.2, at_s=11.0)]
    line = soak_report.timeline(burst)
    assert [w["from_s"] for w in line] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    worst = soak_report.worst_window(line)
    assert worst["from_s"] == 10.0 and worst["p99_ms"] >= 1200 and worst["p50_ms"] == pytest.approx(10)
    assert soak_report.path_summary(burst)["timeline"] == line
