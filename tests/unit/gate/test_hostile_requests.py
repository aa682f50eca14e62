import collections
import json
import random

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from s2t.gate import hostile_requests as hr

PIPELINE = hr.Model("risk_pipeline", (hr.Tensor("payload", "BYTES", (1,)),),
                    (hr.Tensor("probability", "FP32", (1,)), hr.Tensor("decision", "BYTES", (1,))), 256)
SCORER = hr.Model("risk_scorer", (hr.Tensor("categorical", "INT64", (13,)), hr.Tensor("numeric", "FP32", (7,))),
                  (hr.Tensor("probability", "FP32", (1,)),), 256)
MODELS = (PIPELINE, SCORER)
PAYLOADS = (b'{"features": {"age": 30}}', b'{"request_id": "r", "features": {}}')
seeds = st.integers(0, 2**32)
indexes = st.integers(0, 10_000)


def kinds(requests) -> collections.Counter:
    return collections.Counter(name for r in requests for name in r.kind.split(" + "))


@pytest.mark.parametrize("config_type, datatype", [("TYPE_STRING", "BYTES"), ("TYPE_FP32", "FP32"),
                                                   ("TYPE_INT64", "INT64"), ("TYPE_BOOL", "BOOL")])
def test_config_types_take_their_kserve_names(config_type, datatype):
    assert hr.kserve_datatype(config_type) == datatype


@pytest.mark.parametrize("values, datatype, expected", [
    ([b"ab", b""], "BYTES", b"\x02\x00\x00\x00ab\x00\x00\x00\x00"),
    ([1, -1], "INT64", b"\x01" + b"\x00" * 7 + b"\xff" * 8),
    ([1.0], "FP32", b"\x00\x00\x80\x3f"),
    ([1.0], "BF16", b"\x80\x3f"),
    ([True, False], "BOOL", b"\x01\x00"),
    ([], "FP64", b""),
])
def test_tensors_serialize_as_kserve_lays_them_out(values, datatype, expected):
    assert hr.serialize(values, datatype) == expected


@pytest.mark.parametrize("value, width, expected", [
    (0, 0, b"\x00"), (1, 0, b"\x01"), (300, 0, b"\xac\x02"), (1, 3, b"\x81\x80\x00"),
    (-1, 0, b"\xff" * 9 + b"\x01"), (10, 10, b"\x8a" + b"\x80" * 8 + b"\x00"),
])
def test_varints_are_written_canonical_or_padded_to_their_width(value, width, expected):
    assert hr.varint(value, width) == expected


@given(st.integers(0, 2**64 - 1), st.integers(0, 10))
def test_an_overlong_varint_within_10_bytes_reads_as_its_value(value, width):
    data = hr.varint(value, width)
    assert hr.read_varint(data, 0) == (value, len(data))


def test_wire_fields_name_each_top_level_field():
    message = service_pb2.ModelInferRequest(model_name="m", id="abc")
    message.raw_input_contents.append(b"xy")
    fields = hr.wire_fields(message.SerializeToString())
    assert [(f.number, f.wire_type, f.end - f.value_start) for f in fields] == [(1, 2, 1), (3, 2, 3), (7, 2, 2)]


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0b", b"\x80" * 11, b"\x02\x00"])
def test_wire_fields_refuse_what_is_no_message(data):
    with pytest.raises(ValueError):
        hr.wire_fields(data)


def sample_message() -> bytes:
    message = service_pb2.ModelInferRequest(model_name="risk_pipeline", id="x", model_version="1")
    message.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    message.raw_input_contents.append(b"\x02\x00\x00\x00{}")
    return message.SerializeToString(deterministic=True)


@pytest.mark.parametrize("damage, parsed_same", [
    ("overlong tag within 5 bytes", True), ("overlong length within 5 bytes", True),
    ("varint past 10 bytes", False), ("length past the end", False), ("invalid wire type", False),
    ("field number 0", False), ("string that is not UTF-8", False), ("nested length past the end", False),
])
def test_wire_damage_is_what_protobuf_takes_or_refuses(damage, parsed_same):
    original = sample_message()
    for seed in range(20):
        data = hr.damaged(original, damage, seed)
        assert data != original
        try:
            same = service_pb2.ModelInferRequest.FromString(data) == service_pb2.ModelInferRequest.FromString(
                original)
        except DecodeError:
            same = False
        assert same == parsed_same, (damage, seed, data)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(hr.WIRE_DAMAGE_NAMES), seeds)
def test_wire_damage_is_total_and_the_same_for_the_same_seed(data, damage, seed):
    assert hr.damaged(data, damage, seed) == hr.damaged(data, damage, seed)


@settings(max_examples=40, deadline=None)
@given(seeds, indexes)
def test_the_same_seed_and_index_make_the_same_http_request(seed, index):
    assert hr.http_request(MODELS, PAYLOADS, seed, index) == hr.http_request(MODELS, PAYLOADS, seed, index)


@settings(max_examples=40, deadline=None)
@given(seeds, indexes)
def test_the_same_seed_and_index_make_the_same_grpc_request_and_stream(seed, index):
    # repr: a NaN element is the same request, though never equal to itself
    assert repr(hr.grpc_request(MODELS, PAYLOADS, seed, index)) == repr(hr.grpc_request(MODELS, PAYLOADS, seed, index))
    assert repr(hr.grpc_stream(MODELS, PAYLOADS, seed, index)) == repr(hr.grpc_stream(MODELS, PAYLOADS, seed, index))


def test_different_seeds_make_different_requests():
    first = list(hr.http_requests(MODELS, PAYLOADS, 1, 50))
    assert first == list(hr.http_requests(MODELS, PAYLOADS, 1, 50))
    assert first != list(hr.http_requests(MODELS, PAYLOADS, 2, 50))


def test_two_thousand_requests_reach_every_edge_of_either_port():
    http = list(hr.http_requests(MODELS, PAYLOADS, 0, 2000))
    grpc = list(hr.grpc_requests(MODELS, PAYLOADS, 0, 2000))
    http_kinds, grpc_kinds = kinds(http), kinds(grpc)
    for name in (*hr.SPEC_EDGE_NAMES, *hr.HTTP_BODY_EDGE_NAMES, "valid"):
        assert http_kinds[name] >= 3, name
    assert sum(1 for k in http_kinds if k.startswith("route ")) >= 20
    for name in (*hr.SPEC_EDGE_NAMES, *hr.WIRE_DAMAGE_NAMES, "typed contents", "valid"):
        assert grpc_kinds[name] >= 3, name
    for requests in (http, grpc):
        refused = sum(r.refused for r in requests)
        assert 0.2 * len(requests) < refused < 0.8 * len(requests)


def test_a_stream_holds_one_to_thirty_requests():
    sizes = {len(hr.grpc_stream(MODELS, PAYLOADS, 3, i).requests) for i in range(300)}
    assert min(sizes) == 1 and max(sizes) == 30


def test_valid_http_requests_are_the_json_kserve_describes():
    for request in hr.http_requests(MODELS, PAYLOADS, 5, 300):
        if request.kind != "valid":
            continue
        headers = dict(request.headers)
        end = int(headers.get(hr.BINARY_HEADER, len(request.body)))
        body = json.loads(request.body[:end])
        binary = sum(i.get("parameters", {}).get("binary_data_size", 0) for i in body["inputs"])
        assert end + binary == len(request.body)
        assert request.path in (hr.infer_path(m.name) for m in MODELS) and not request.refused
        for tensor in body["inputs"]:
            rows = 1
            for d in tensor["shape"]:
                rows *= d
            assert "data" not in tensor or len(tensor["data"]) == rows


def test_requests_known_to_crash_triton_are_marked_and_must_be_refused():
    crashing = [r for r in hr.http_requests(MODELS, PAYLOADS, 0, 2000) if not r.triton_defined]
    assert crashing and all("classification of a BYTES output" in r.kind for r in crashing)
    assert all(r.refused for r in crashing if set(r.kind.split(" + ")) <= set(hr.SPEC_EDGE_NAMES))


@pytest.mark.parametrize("value, fails, expected", [
    ({"a": 1, "b": [1, 2, 3, 9], "c": "long text"}, lambda v: 9 in v.get("b", []), {"b": [9]}),
    ([5, 7, 100, 3], lambda v: any(x > 50 for x in v), [51]),
    (b"xxxxBADxxxx", lambda v: b"BAD" in v, b"BAD"),
    ({"k": "v"}, lambda v: False, {"k": "v"}),
])
def test_shrink_finds_the_smallest_value_that_still_fails(value, fails, expected):
    assert hr.shrink(value, fails) == expected


@settings(max_examples=50, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                                 max_size=4), max_leaves=12),
       st.integers(0, 3))
def test_a_shrunk_value_still_fails_and_is_no_larger(value, threshold):
    def fails(v):
        return hr.size_of(v) > threshold
    shrunk = hr.shrink(value, fails, max_tries=300)
    assert hr.size_of(shrunk) <= hr.size_of(value)
    assert fails(shrunk) == fails(value)


def test_element_values_fit_their_datatype():
    rng = random.Random(0)
    for datatype in hr.DATATYPES:
        values = hr.element_values(datatype, 20, rng, PAYLOADS)
        assert len(hr.serialize(values, datatype)) == (
            len(hr.serialize(values, "BYTES")) if datatype == "BYTES" else 20 * len(hr.serialize(values[:1], datatype)))
