"""The protobuf form of the legacy record decodes like the JSON form: same rows, same errors, mixed in a batch."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.records.record_decoder import RecordDecoder, RecordError
from s2t.clients.legacy_record import encode, feature_value, to_protobuf
from s2t.wire import skill_pb2
from tests.samples import SPEC, VALID


def both_forms(features, **envelope):
    record = {"request_id": "r-1", "stream_id": "s-1", "sequence_id": 7, **envelope, "features": features}
    return encode(record, "json"), encode(record, "protobuf")


def error_of(payload, decoder=RecordDecoder(SPEC)):
    error = decoder.decode([payload]).errors[0]
    return None if error is None else (error.field, error.reason)


def test_protobuf_record_decodes_to_the_same_row_as_its_json_twin():
    as_json, as_protobuf = both_forms(VALID)
    batch = RecordDecoder(SPEC).decode([as_json, as_protobuf])
    assert batch.errors == (None, None)
    assert batch.categorical[0].tolist() == batch.categorical[1].tolist() == [2, 2]
    assert np.array_equal(batch.numeric[0], batch.numeric[1])


def test_parse_reads_the_envelope_of_both_forms():
    for payload in both_forms(VALID):
        record = RecordDecoder(SPEC).parse(payload)
        assert (record.request_id, record.stream_id, record.sequence_id) == ("r-1", "s-1", 7)


@pytest.mark.parametrize("name, value, field, reason", [
    ("housing", None, "features.housing", "missing"),
    ("credit_amount", None, "features.credit_amount", "missing"),
    ("age_in_years", "35", "features.age_in_years", "expected a number, got string"),
    ("age_in_years", True, "features.age_in_years", "expected a number, got boolean"),
    ("housing", 3, "features.housing", "expected a string, got number"),
    ("housing", 3.5, "features.housing", "expected a string, got number"),
    ("credit_amount", float("nan"), "features.credit_amount", "not a finite float32 number (nan)"),
    ("credit_amount", float("inf"), "features.credit_amount", "not a finite float32 number (inf)"),
    ("credit_amount", 1e39, "features.credit_amount", "not a finite float32 number (1e+39)"),
])
def test_bad_attribute_gives_the_same_error_in_both_forms(name, value, field, reason):
    as_json, as_protobuf = both_forms({**VALID, name: value})
    assert error_of(as_json) == error_of(as_protobuf) == (field, reason)


def test_empty_feature_map_reports_the_first_attribute_missing_in_both_forms():
    as_json, as_protobuf = both_forms({})
    assert error_of(as_json) == error_of(as_protobuf) == ("features.housing", "missing")


@pytest.mark.parametrize("payload", [
    b"\x0a\xff",  # field 1 claims 255 bytes, 0 follow
    b"\x12\x02\xc3\x28",  # stream_id is not UTF-8
    b"\x2a\x05\x0a\x01",  # truncated map entry
    b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # varint longer than 10 bytes
])
def test_malformed_protobuf_is_an_error_for_that_record_alone(payload):
    batch = RecordDecoder(SPEC).decode([payload, encode({"features": VALID}, "protobuf")])
    assert batch.errors[0].field == "payload" and "not a valid SkillRecord protobuf" in batch.errors[0].reason
    assert batch.errors[1] is None


def test_oversized_protobuf_is_refused_before_parsing():
    payload = encode({"features": {**VALID, "padding": "x" * 2000}}, "protobuf")
    assert error_of(payload, RecordDecoder(SPEC, max_record_bytes=1024)) == (
        "payload", f"{len(payload)} bytes is over the limit of 1024")


@pytest.mark.parametrize("payload, field, reason", [
    (b"\n\n {\"features\": {}}", "features.housing", "missing"),  # JSON after whitespace that is also a tag
    (b" [1]", "payload", "a record must be a JSON object"),
    (b"\n not json", "payload", "not valid JSON"),
    (b"<record/>", "payload", "not valid JSON"),
])
def test_json_that_starts_like_protobuf_is_still_read_as_json(payload, field, reason):
    field_got, reason_got = error_of(payload)
    assert field_got == field and reason in reason_got


def test_a_protobuf_whose_request_id_looks_like_json_is_read_as_protobuf():
    # Field 1 with length 0x7B: after the 0x0A tag, a JSON reader would see "{".
    record = {"request_id": "x" * 0x7B, "features": VALID}
    payload = encode(record, "protobuf")
    assert payload[:2] == b"\n{"
    assert RecordDecoder(SPEC).parse(payload).request_id == "x" * 0x7B


def test_a_feature_of_an_unsupported_type_cannot_be_encoded():
    with pytest.raises(TypeError, match="got list"):
        feature_value([1])


feature_values = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(max_size=8)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(list(VALID) + ["other"]), feature_values))
def test_any_feature_map_decodes_identically_in_both_forms(features):
    as_json, as_protobuf = both_forms(features)
    batch = RecordDecoder(SPEC).decode([as_json, as_protobuf])
    errors = [None if e is None else (e.field, e.reason) for e in batch.errors]
    assert errors[0] == errors[1]
    if errors[0] is None:
        assert np.array_equal(batch.categorical[0], batch.categorical[1])
        assert np.array_equal(batch.numeric[0], batch.numeric[1])


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256).map(lambda b: b"\x2a" + b))
def test_arbitrary_bytes_after_a_protobuf_tag_give_a_record_error_or_a_row(payload):
    error = RecordDecoder(SPEC).decode([payload]).errors[0]
    assert error is None or (isinstance(error, RecordError) and error.field and error.reason)


def test_records_round_trip_through_the_generated_message():
    record = {"request_id": "r-9", "stream_id": "s-2", "sequence_id": 41, "event_time_ms": 1_700_000_000_000,
              "features": {"housing": "own", "credit_amount": 1234.5, "age_in_years": 35}}
    message = skill_pb2.SkillRecord.FromString(to_protobuf(record).SerializeToString())
    assert message.sequence_id == 41 and message.event_time_ms == 1_700_000_000_000
    assert message.features["age_in_years"].int_value == 35
    assert math.isclose(message.features["credit_amount"].number_value, 1234.5)
    assert json.loads(encode(record, "json")) == record
