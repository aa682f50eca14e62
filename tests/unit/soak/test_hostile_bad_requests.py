"""The careless caller's requests of `s2t soak --hostile` and how their answers are counted: each invalid record is
refused by the project's own decoder naming the field the soak expects, the malformed BYTES buffer is refused by
the project's own BYTES reader, and an answer counts as right only when it refuses (or scores) as it must."""
import json

import pytest

from s2t.backends.runtime import bytes_tensor
from s2t.backends.records.record_decoder import RecordDecoder, RecordError, parse_record
from s2t.soak.hostile import bad_requests
from s2t.soak.hostile.bad_requests import INVALID_KINDS, Answer

FEATURES = {"purpose": "car (new)", "duration_in_month": 6, "credit_amount": 1169}


@pytest.mark.parametrize("kind, field", [
    ("missing_feature", "features.duration_in_month"),
    ("wrong_type", "features.duration_in_month"),
    ("not_json", "payload"),
    ("over_64_kib", "payload"),
    ("long_request_id", "request_id"),
])
def test_each_bad_record_names_the_field_its_refusal_must_name(kind, field):
    bad = bad_requests.bad_record(kind, FEATURES, "r-1")
    assert (bad.kind, bad.field) == (kind, field)


@pytest.mark.parametrize("kind", INVALID_KINDS)
def test_the_projects_decoder_refuses_each_bad_record_naming_that_field(kind, german_credit_data, feature_spec):
    bad = bad_requests.bad_record(kind, german_credit_data.records()[0], "soak-7")
    decoded = RecordDecoder(feature_spec).decode([bad.payload])
    error = decoded.errors[0]
    assert isinstance(error, RecordError) and error.field == bad.field, error
    assert str(error).startswith(f"{bad.field}: ")


def test_a_bad_record_is_otherwise_the_valid_record(german_credit_data):
    features = german_credit_data.records()[3]
    bad = bad_requests.bad_record("long_request_id", features, "soak-3")
    assert json.loads(bad.payload)["features"] == features
    missing = json.loads(bad_requests.bad_record("missing_feature", features, "soak-3").payload)["features"]
    assert len(missing) == len(features) - 1 and set(missing) < set(features)


def test_an_unknown_kind_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match="missing_feature, wrong_type"):
        bad_requests.bad_record("too_polite", FEATURES, "r")


@pytest.mark.parametrize("k, kind, protocol", [
    (0, None, "http"), (1, None, "grpc"), (3, None, "grpc"),
    (4, "missing_feature", "http"), (9, "wrong_type", "http"), (14, "not_json", "http"),
    (19, "over_64_kib", "http"), (24, "long_request_id", "http"),
    (29, "missing_feature", "grpc"), (49, "long_request_id", "grpc"), (54, "missing_feature", "http"),
])
def test_every_fifth_request_is_invalid_the_kinds_taking_turns_over_both_protocols(k, kind, protocol):
    assert bad_requests.kind_of_request(k) == kind
    assert bad_requests.protocol_of(k) == protocol


def test_fifty_requests_carry_every_kind_over_both_protocols_and_forty_valid_ones():
    plan = [(bad_requests.kind_of_request(k), bad_requests.protocol_of(k)) for k in range(50)]
    assert sum(kind is None for kind, _ in plan) == 40
    assert {(kind, protocol) for kind, protocol in plan if kind} == {(kind, protocol) for kind in INVALID_KINDS
                                                                      for protocol in ("http", "grpc")}


def test_the_binary_data_request_carries_the_buffer_byte_for_byte_after_its_json_header():
    raw = bytes_tensor.encode([b'{"features": {}}'])
    body, headers = bad_requests.binary_data_request(raw, rows=1)
    size = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:size])
    assert body[size:] == raw
    assert header["inputs"] == [{"name": "payload", "shape": [1, 1], "datatype": "BYTES",
                                 "parameters": {"binary_data_size": len(raw)}}]


@pytest.mark.parametrize("data, past_end", [(b"", 1), (b'{"features": {}}', 100), (b"x" * 70, 2**20)])
def test_an_overrunning_element_says_more_bytes_than_its_buffer_holds(data, past_end):
    raw = bad_requests.overrunning_element(data, past_end)
    assert len(raw) == 4 + len(data)
    with pytest.raises(ValueError, match="runs past the end"):
        bytes_tensor.decode(raw)
    assert bytes_tensor.decode(bytes_tensor.encode([data])) == [data]


def test_the_valid_record_a_malformed_element_wraps_parses():
    record = json.dumps({"features": FEATURES}).encode()
    assert parse_record(bytes_tensor.decode(bytes_tensor.encode([record]))[0]).features == FEATURES


@pytest.mark.parametrize("answer, as_expected, label", [
    (Answer("valid (http)", None, "HTTP 200"), True, "valid (http): answered"),
    (Answer("valid (grpc)", None, "OK"), True, "valid (grpc): answered"),
    (Answer("valid (grpc)", None, "RESOURCE_EXHAUSTED", "queue full"), False,
     "valid (grpc): RESOURCE_EXHAUSTED queue full"),
    (Answer("valid (http)", None, None, "ConnectionResetError"), False,
     "valid (http): no answer (ConnectionResetError)"),
    (Answer("not_json (http)", "payload", "HTTP 400", "payload: not valid JSON"), True,
     "not_json (http): HTTP 400 naming payload"),
    (Answer("wrong_type (grpc)", "features.age", "INVALID_ARGUMENT", "features.age: expected a number, got string"),
     True, "wrong_type (grpc): INVALID_ARGUMENT naming features.age"),
    # Refused, but naming another field, or not as the caller's error, or not at all:
    (Answer("wrong_type (grpc)", "features.age", "INVALID_ARGUMENT", "payload: not valid JSON"), False,
     "wrong_type (grpc): INVALID_ARGUMENT payload: not valid JSON"),
    (Answer("malformed_bytes", "payload", "HTTP 500", "payload: element 0 runs past"), False,
     "malformed_bytes: HTTP 500 payload: element 0 runs past"),
    (Answer("malformed_bytes", "payload", "HTTP 200"), False, "malformed_bytes: HTTP 200 "),
    (Answer("over_64_kib (http)", "payload", "HTTP 400", "payloads: 70000 bytes"), False,
     "over_64_kib (http): HTTP 400 payloads: 70000 bytes"),
    (Answer("long_request_id (grpc)", "request_id", "UNAVAILABLE", "Socket closed"), False,
     "long_request_id (grpc): UNAVAILABLE Socket closed"),
    (Answer("missing_feature (http)", "features.age", None, "RemoteDisconnected"), False,
     "missing_feature (http): no answer (RemoteDisconnected)"),
])
def test_an_answer_is_right_only_when_it_scores_a_valid_request_or_refuses_an_invalid_one_naming_its_field(
        answer, as_expected, label):
    assert answer.as_expected is as_expected
    assert answer.label() == label


def test_counting_a_flood_sums_each_side_and_shows_what_went_wrong():
    answers = ([Answer("valid (http)", None, "HTTP 200")] * 8 + [Answer("valid (grpc)", None, None, "reset")]
               + [Answer("not_json (http)", "payload", "HTTP 400", "payload: not valid JSON")] * 2
               + [Answer("malformed_bytes", "payload", "HTTP 500", "boom")])
    result = bad_requests.count(answers)
    assert result["sent"] == 12 and result["unanswered"] == 1
    assert result["invalid"] == {"sent": 3, "as_expected": 2} and result["valid"] == {"sent": 9, "as_expected": 8}
    assert result["outcomes"] == {"valid (http): answered": 8, "valid (grpc): no answer (reset)": 1,
                                  "not_json (http): HTTP 400 naming payload": 2, "malformed_bytes: HTTP 500 boom": 1}
    assert result["unexpected"] == ["malformed_bytes: HTTP 500 boom", "valid (grpc): no answer (reset)"]
    assert bad_requests.count([]) == {"sent": 0, "outcomes": {}, "unanswered": 0, "unexpected": [],
                                      "invalid": {"sent": 0, "as_expected": 0}, "valid": {"sent": 0, "as_expected": 0}}
