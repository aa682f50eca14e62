import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.samples import SPEC, VALID
from s2t.backends.records.record_decoder import (MAX_FEATURES, MAX_ID_CHARS, RecordDecoder, RecordError,
                                                 encode_columns, parse_record, stream_position)
from s2t.backends.runtime.serving_errors import request_error



def record(features=VALID, **extra) -> bytes:
    return json.dumps({"request_id": "r-1", "features": features, **extra}).encode()


def with_feature(name, value):
    return record({**VALID, name: value})


def without(name):
    return record({k: v for k, v in VALID.items() if k != name})


def test_valid_record_becomes_vocabulary_indices_and_float32_numbers():
    batch = RecordDecoder(SPEC).decode([record()])
    assert batch.errors == (None,)
    assert batch.categorical.tolist() == [[2, 2]]
    assert batch.categorical.dtype == np.int64
    assert batch.numeric.dtype == np.float32
    assert batch.numeric.tolist() == [[35.0, np.float32(1234.5)]]


def test_unknown_category_takes_the_out_of_vocabulary_index_not_an_error():
    batch = RecordDecoder(SPEC).decode([with_feature("housing", "castle")])
    assert batch.errors == (None,)
    assert batch.categorical[0, 0] == 0


@pytest.mark.parametrize("payload, field, reason", [
    (b"", "payload", "empty"),
    (b"not json", "payload", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "payload", "not valid JSON"),
    (b"[1, 2]", "payload", "must be a JSON object, got array"),
    (json.dumps({"request_id": "r"}).encode(), "features", "missing"),
    (json.dumps({"features": [1]}).encode(), "features", "must be an object, got array"),
    (without("housing"), "features.housing", "missing"),
    (without("credit_amount"), "features.credit_amount", "missing"),
    (with_feature("age_in_years", "35"), "features.age_in_years", "expected a number, got string"),
    (with_feature("age_in_years", True), "features.age_in_years", "expected a number, got boolean"),
    (with_feature("age_in_years", None), "features.age_in_years", "missing"),
    (with_feature("housing", 3), "features.housing", "expected a string, got number"),
    (with_feature("credit_amount", float("nan")), "features.credit_amount", "not a finite"),
    (with_feature("credit_amount", float("inf")), "features.credit_amount", "not a finite"),
    (with_feature("credit_amount", 1e39), "features.credit_amount", "not a finite float32"),
    (with_feature("credit_amount", 10 ** 400), "features.credit_amount", "not a finite"),
    (b"[" * 100_000 + b"]" * 100_000, "payload", "nested too deeply"),
])
def test_malformed_record_names_the_field_and_the_reason(payload, field, reason):
    batch = RecordDecoder(SPEC, max_record_bytes=1 << 20).decode([payload])
    error = batch.errors[0]
    assert isinstance(error, RecordError)
    assert error.field == field
    assert reason in error.reason
    assert str(error).startswith(field)


def test_oversized_payload_is_refused_before_parsing():
    decoder = RecordDecoder(SPEC, max_record_bytes=1024)
    error = decoder.decode([record({**VALID, "padding": "x" * 2000})]).errors[0]
    assert error.field == "payload"
    assert "over the limit of 1024" in error.reason


def test_bad_record_does_not_disturb_its_batch_mates():
    batch = RecordDecoder(SPEC).decode([record(), b"{", with_feature("housing", "own")])
    assert batch.errors[0] is None and batch.errors[2] is None
    assert isinstance(batch.errors[1], RecordError)
    assert batch.categorical[[0, 2]].tolist() == [[2, 2], [1, 2]]


def test_request_error_lists_each_bad_record_of_a_multi_record_request():
    errors = (None, RecordError("features.housing", "missing"), RecordError("payload", "empty"))
    assert request_error(errors) == "record 1: features.housing: missing; record 2: payload: empty"
    assert request_error((RecordError("payload", "empty"),)) == "payload: empty"
    assert request_error((None, None)) is None


def test_encode_columns_matches_the_decoder_row_for_row():
    columns = {"housing": np.array(["own", "castle"], dtype=object), "telephone": np.array(["yes", "none"], dtype=object),
               "age_in_years": np.array([35, 50], dtype=np.float32),
               "credit_amount": np.array([1234.5, 99], dtype=np.float32)}
    categorical, numeric = encode_columns(SPEC, columns)
    records = [record({n: (c[i].item() if hasattr(c[i], "item") else c[i]) for n, c in columns.items()}) for i in range(2)]
    decoded = RecordDecoder(SPEC).decode(records)
    assert np.array_equal(categorical, decoded.categorical)
    assert np.array_equal(numeric, decoded.numeric)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_give_a_record_error_or_a_row_never_a_crash(payload):
    batch = RecordDecoder(SPEC).decode([payload, record()])
    assert batch.errors[1] is None
    error = batch.errors[0]
    assert error is None or (isinstance(error, RecordError) and error.field and error.reason)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(list(VALID) + ["other"]), json_values))
def test_any_json_feature_map_is_decoded_or_refused_naming_a_field(features):
    error = RecordDecoder(SPEC).decode([record(features)]).errors[0]
    if error is not None:
        assert error.field.startswith("features.") and error.field[len("features."):] in VALID


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_float32_numbers_round_trip_exactly(value):
    batch = RecordDecoder(SPEC).decode([with_feature("credit_amount", value)])
    assert batch.errors == (None,)
    assert batch.numeric[0, 1] == np.float32(value)
    assert math.isfinite(float(batch.numeric[0, 1]))


def test_request_ids_come_back_per_record_as_text():
    batch = RecordDecoder(SPEC).decode([record(), b"{", json.dumps({"request_id": 7, "features": VALID}).encode(),
                                        json.dumps({"features": VALID}).encode()])
    assert batch.request_ids == ("r-1", None, "7", None)


def huge_integer(digits: int) -> bytes:
    return b"1" * digits


@pytest.mark.parametrize("payload", [
    record()[:-1] + b', "pad": ' + huge_integer(5000) + b"}",
    record()[:-1] + b', "sequence_id": -' + huge_integer(4301) + b"}",
    json.dumps({"features": VALID, "x": [[[0]]]}).encode().replace(b"0", huge_integer(10_000)),
    with_feature("credit_amount", 0).replace(b'"credit_amount": 0', b'"credit_amount": ' + huge_integer(4400)),
])
def test_a_json_integer_longer_than_python_converts_is_that_records_error_anywhere_in_it(payload):
    batch = RecordDecoder(SPEC).decode([payload, record()])
    assert batch.errors[1] is None
    assert str(batch.errors[0]) == "payload: a JSON integer has more than 4300 digits"


@pytest.mark.parametrize("extra, field, reason", [
    ({"request_id": "r" * (MAX_ID_CHARS + 1)}, "request_id", f"{MAX_ID_CHARS + 1} characters is over the limit"),
    ({"request_id": ["r-1"]}, "request_id", "expected a string, got array"),
    ({"request_id": True}, "request_id", "expected a string, got boolean"),
    ({"stream_id": {"a": 1}}, "stream_id", "expected a string, got object"),
    ({"stream_id": "s" * 1000}, "stream_id", "1000 characters is over the limit"),
    ({"features": {**VALID, **{f"x{i}": i for i in range(MAX_FEATURES)}}}, "features",
     f"{MAX_FEATURES + 4} entries is over the limit of {MAX_FEATURES}"),
])
def test_the_envelope_is_bounded_and_each_bound_names_its_field(extra, field, reason):
    error = RecordDecoder(SPEC).decode([json.dumps({"features": VALID, **extra}).encode()]).errors[0]
    assert error is not None and error.field == field and reason in error.reason


def test_a_4300_digit_integer_is_still_a_number():
    batch = RecordDecoder(SPEC).decode([with_feature("credit_amount", 10 ** 4299)])
    assert batch.errors[0].field == "features.credit_amount" and "not a finite float32 number" in batch.errors[0].reason
    assert len(str(batch.errors[0])) < 200, "the message does not echo the number in full"


@pytest.mark.parametrize("sequence_id, reason", [
    (None, "missing"), ("3", "expected an integer, got string"), (1.5, "expected an integer, got number"),
    (True, "expected an integer, got boolean"), (-1, "-1 is outside 0..9223372036854775807"),
    (2 ** 63, "9223372036854775808 is outside 0..9223372036854775807"), (10 ** 400, "is outside 0.."),
    (-(10 ** 4000), "is outside 0.."),
])
def test_a_sequence_id_outside_int64_and_below_zero_is_refused_naming_it(sequence_id, reason):
    with pytest.raises(RecordError) as err:
        stream_position(parse_record(record(sequence_id=sequence_id)), "s")
    assert err.value.field == "sequence_id" and reason in err.value.reason
    assert len(str(err.value)) < 200


@pytest.mark.parametrize("sequence_id", [0, 1, 2 ** 63 - 1])
def test_sequence_ids_within_int64_are_taken(sequence_id):
    assert stream_position(parse_record(record(sequence_id=sequence_id)), "s") == sequence_id


# Integers too long for json.dumps (and for hypothesis to print) are spliced in as text where "HUGE" stands.
envelope_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
                               | st.just("HUGE"),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                           max_size=3), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["request_id", "stream_id", "sequence_id", "features", "pad"]),
                       envelope_values), st.integers(min_value=1, max_value=20_000), st.booleans())
def test_any_json_envelope_gives_a_record_or_its_error_never_an_exception(envelope, digits, negative):
    payload = json.dumps(envelope).encode().replace(b'"HUGE"', b"-" * negative + b"7" * digits)
    batch = RecordDecoder(SPEC).decode([payload])
    try:
        stream_position(parse_record(payload), "s")
    except RecordError:
        pass
    assert batch.errors[0] is None or isinstance(batch.errors[0], RecordError)
