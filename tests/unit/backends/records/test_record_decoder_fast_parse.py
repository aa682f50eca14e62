"""The decoder parses JSON records with orjson first and with the standard library where orjson cannot, or where the
record fails: every batch must decode exactly as the standard library alone decodes it (rows, errors, request ids)."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.records import record_decoder
from s2t.backends.records.feature_spec import INTEGER, CategoricalFeature, FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder

SPEC = FeatureSpec(
    categorical=(CategoricalFeature("housing", {"own": 1, "rent": 2}, 0),
                 CategoricalFeature("branch", {}, 0, INTEGER)),
    numeric=("age_in_years", "credit_amount"),
)
VALID = {"housing": "rent", "branch": 7, "age_in_years": 35, "credit_amount": 1234.5}


def both_ways(payloads: list[bytes], monkeypatch) -> tuple:
    decoder = RecordDecoder(SPEC)
    fast = decoder.decode(payloads)
    with monkeypatch.context() as patch:
        patch.setattr(record_decoder, "_fast_json_loads", None)
        exact = decoder.decode(payloads)
    return fast, exact


def assert_same(fast, exact) -> None:
    assert np.array_equal(fast.categorical, exact.categorical)
    assert fast.numeric.tobytes() == exact.numeric.tobytes()
    assert [str(e) if e else None for e in fast.errors] == [str(e) if e else None for e in exact.errors]
    assert fast.request_ids == exact.request_ids


def record(features=VALID, **envelope) -> bytes:
    return json.dumps({"request_id": "r-1", **envelope, "features": features}).encode()


def test_a_valid_record_takes_the_fast_parse():
    assert RecordDecoder(SPEC)._parse_fast(record()) is not None


HUGE = "1" + "0" * 25  # past 64 bits: orjson reads a float, the standard library an int
EDGES = {
    "valid": record(),
    "a request id past 64 bits": record(request_id=None).replace(b'"request_id": null', f'"request_id": {HUGE}'.encode()),
    "a number past 64 bits": record({**VALID, "credit_amount": "HUGE"}).replace(b'"HUGE"', HUGE.encode()),
    "an integer feature past 64 bits": record({**VALID, "branch": "HUGE"}).replace(b'"HUGE"', HUGE.encode()),
    "an integer feature past int64": record({**VALID, "branch": 2 ** 63}),
    "a number past a double": record({**VALID, "credit_amount": "HUGE"}).replace(b'"HUGE"', b"1" + b"0" * 400),
    "NaN": record({**VALID, "age_in_years": "X"}).replace(b'"X"', b"NaN"),
    "Infinity": record({**VALID, "age_in_years": "X"}).replace(b'"X"', b"-Infinity"),
    "1e400": record({**VALID, "age_in_years": "X"}).replace(b'"X"', b"1e400"),
    "a lone surrogate": record({**VALID, "housing": "X"}).replace(b'"X"', b'"\\ud800"'),
    "a surrogate pair": record({**VALID, "housing": "X"}).replace(b'"X"', b'"\\ud83d\\ude00"'),
    "a UTF-8 BOM": b"\xef\xbb\xbf" + record(),
    "UTF-16": json.dumps({"features": VALID}).encode("utf-16-le"),
    "deep nesting": record({**VALID, "pad": "X"}).replace(b'"X"', b"[" * 1500 + b"]" * 1500),
    # Within orjson's 1,024 levels, past what Python 3.11's parser takes (about 1,000 less the stack in use).
    "nesting 1,000 levels deep": record({**VALID, "pad": "X"}).replace(b'"X"', b"[" * 1000 + b"]" * 1000),
    "nesting 1,020 levels deep in objects": record({**VALID, "pad": "X"}).replace(
        b'"X"', b'{"a": ' * 1020 + b"1" + b"}" * 1020),
    "a duplicate key": record().replace(b'"housing": "rent"', b'"housing": "own", "housing": "rent"'),
    "leading whitespace": b" \n" + record(),
    "not an object": b'{"features": [1]}',
    "a list": b"[1, 2]",
    "truncated": record()[:-3],
    "a bool for a number": record({**VALID, "age_in_years": True}),
    "a float32 overflow": record({**VALID, "credit_amount": 1e39}),
    "an overlong id": record(request_id="x" * 300),
}


@pytest.mark.parametrize("payload", EDGES.values(), ids=EDGES.keys())
def test_edges_of_json_decode_as_the_standard_library_decodes_them(payload, monkeypatch):
    assert_same(*both_ways([payload, record()], monkeypatch))


values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
                      | st.sampled_from(["HUGE", "NAN", "SURROGATE"]),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                  max_size=3), max_leaves=6)
RAW = {b'"HUGE"': b"123456789012345678901234567890", b'"NAN"': b"NaN", b'"SURROGATE"': b'"\\udc00"'}


@settings(max_examples=500, deadline=None)
@given(st.fixed_dictionaries({}, optional={"request_id": values, "stream_id": values,
                                           "features": st.fixed_dictionaries({}, optional={
                                               name: st.one_of(st.just(value), values)
                                               for name, value in VALID.items()})}),
       st.booleans())
def test_any_json_record_decodes_as_the_standard_library_decodes_it(envelope, ascii_only):
    payload = json.dumps(envelope, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    for token, raw in RAW.items():
        payload = payload.replace(token, raw)
    assert_same(*both_ways([payload, record()], monkeypatch=pytest.MonkeyPatch()))
