"""TensorFlow's string hash buckets without TensorFlow (backends/records/string_hash.py), and hashed features in the
spec, the decoder and the converter."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.feature_spec import HASH, CategoricalFeature, FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder, encode_columns
from s2t.backends.records.string_hash import FAST, STRONG, fingerprint64, hash_bucket, siphash24
from s2t.models.convert import ConversionError, shape_for_serving

# SipHash-2-4's reference vectors (Aumasson and Bernstein, appendix A): key 00..0f, message 00..len-1.
_KEY = (int.from_bytes(bytes(range(8)), "little"), int.from_bytes(bytes(range(8, 16)), "little"))
SIPHASH_VECTORS = {0: 0x726FDB47DD0E0E31, 1: 0x74F839C593DC67FD, 7: 0xAB0200F58B01D137, 8: 0x93F5F5799A932462,
                   15: 0xA129CA6149BE45E5, 63: 0x958A324CEB064572}


@pytest.mark.parametrize("length, expected", SIPHASH_VECTORS.items())
def test_siphash24_gives_the_reference_vectors(length, expected):
    assert siphash24(_KEY, bytes(range(length))) == expected


def _strings(seed: int, count: int) -> list[str]:
    """Every FarmHash length class (0-3, 4-7, 8-16, 17-32, 33-64, over 64 and several 64-byte blocks), in ASCII,
    two-, three- and four-byte UTF-8."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcXYZ09 ,\"\n\t\x00-é漢字😀\U0010ffff")
    lengths = list(range(0, 140)) + [int(n) for n in rng.integers(0, 400, count)]
    return ["", "é", "😀", "car"] + ["".join(rng.choice(alphabet, size=n)) for n in lengths]


def test_buckets_are_tensorflows_on_strings_of_every_length_and_script(monkeypatch):
    from functools import cache

    import tensorflow as tf

    from s2t.backends.records import string_hash
    # Both hashes are pure functions of the key and the bytes: each string is hashed once per key, then reduced
    # into every bucket count by hash_bucket itself.
    monkeypatch.setattr(string_hash, "fingerprint64", cache(string_hash.fingerprint64))
    monkeypatch.setattr(string_hash, "siphash24", cache(string_hash.siphash24))
    strings = _strings(5, 600)
    for buckets in (1, 2, 8, 1_000_003, 2 ** 63 - 1):
        assert [hash_bucket(s, buckets) for s in strings] == \
            tf.strings.to_hash_bucket_fast(strings, buckets).numpy().tolist(), buckets
        for key in ((133, 133), (0, 0), (2 ** 63 - 1, 7)):
            assert [hash_bucket(s, buckets, STRONG, key) for s in strings] == \
                tf.strings.to_hash_bucket_strong(strings, buckets, list(key)).numpy().tolist(), (buckets, key)


@pytest.mark.parametrize("seed", range(3))
def test_a_bucket_is_within_range_and_the_same_for_the_same_text(seed):
    rng = np.random.default_rng(seed)
    for text in _strings(seed, 50):
        buckets = int(rng.integers(1, 2 ** 62))
        for method in (FAST, STRONG):
            bucket = hash_bucket(text, buckets, method, (seed, seed))
            assert 0 <= bucket < buckets and bucket == hash_bucket(str(text), buckets, method, (seed, seed))
    assert fingerprint64(b"") != fingerprint64(b"\x00")


def test_an_unknown_hash_is_refused():
    with pytest.raises(ValueError, match="unknown hash 'md5'"):
        hash_bucket("car", 8, "md5")


HASHED = CategoricalFeature("merchant", {}, 0, HASH, 8, STRONG, (133, 133))


def test_a_hashed_feature_survives_the_spec_json_and_the_decoder_gives_its_bucket():
    spec = FeatureSpec((HASHED,), ("age",))
    again = FeatureSpec.from_json(spec.to_json())
    assert again == spec
    names = ["shop", "", "漢字", "😀 x"]
    decoded = RecordDecoder(again).decode([json.dumps({"features": {"merchant": n, "age": 1.0}}).encode()
                                           for n in names])
    assert decoded.errors == (None,) * 4
    assert decoded.categorical[:, 0].tolist() == [hash_bucket(n, 8, STRONG, (133, 133)) for n in names]
    categorical, _ = encode_columns(again, {"merchant": np.array(names), "age": np.ones(4)})
    np.testing.assert_array_equal(categorical, decoded.categorical)


@pytest.mark.parametrize("record, reason", [
    ({"merchant": 5, "age": 1.0}, "features.merchant: expected a string, got number"),
    ({"merchant": ["a"], "age": 1.0}, "features.merchant: expected a string, got array"),
    ({"age": 1.0}, "features.merchant: missing"),
    ({"merchant": "\ud800", "age": 1.0}, "features.merchant: not valid Unicode text (a lone surrogate)"),
])
def test_a_hashed_feature_of_another_type_is_that_records_error_alone(record, reason):
    decoder = RecordDecoder(FeatureSpec((HASHED,), ("age",)))
    good = json.dumps({"features": {"merchant": "shop", "age": 2.0}}).encode()
    decoded = decoder.decode([good, json.dumps({"features": record}).encode(), good])
    assert decoded.errors[0] is None and decoded.errors[2] is None
    assert str(decoded.errors[1]) == reason


@pytest.mark.parametrize("change, message", [
    ({"buckets": 0}, "needs buckets > 0 (got 0)"),
    ({"hash": "md5"}, "hash 'fast' or 'strong' (got 'md5')"),
    ({"key": [1]}, "a key of two integers (got 1)"),
])
def test_a_spec_with_a_malformed_hashed_feature_is_refused(change, message):
    raw = json.loads(FeatureSpec((HASHED,), ()).to_json())
    raw["categorical"][0].update(change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FeatureSpec.from_json(json.dumps(raw))


def _hashing_model(*hash_nodes, string_users=()):
    """What tf2onnx leaves of Keras Hashing: the TF op as is, behind a Squeeze, then a one-hot of the bucket."""
    nodes = [helper.make_node("Squeeze", ["merchant", "axes"], ["flat"]), *hash_nodes, *string_users,
             helper.make_node("Gather", ["eye", "bucket"], ["onehot"], axis=0),
             helper.make_node("MatMul", ["onehot", "w"], ["output_0"])]
    graph = helper.make_graph(
        nodes, "tf2onnx", [helper.make_tensor_value_info("merchant", TensorProto.STRING, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"),
         numpy_helper.from_array(np.eye(8, dtype=np.float32), "eye"),
         numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(8, 1), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def test_a_hashed_string_input_is_lifted_into_the_spec_and_the_graph_scores_its_bucket():
    strong = helper.make_node("StringToHashBucketStrong", ["flat"], ["bucket"], name="hashing/hash", num_buckets=8,
                              key=[133, 133])
    served, spec = shape_for_serving(_hashing_model(strong))
    assert spec.categorical == (HASHED,)
    names = ["shop", "", "漢字", "a much longer merchant name than sixty-four bytes, to take the block path"]
    decoded = RecordDecoder(spec).decode([json.dumps({"features": {"merchant": n}}).encode() for n in names])
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"categorical": decoded.categorical})[0]
    assert got.ravel().tolist() == [float(hash_bucket(n, 8, STRONG, (133, 133))) for n in names]


def test_a_string_looked_up_and_hashed_carries_index_and_bucket_in_one_column_and_scores_both():
    """Keras StringLookup with num_oov_indices > 1: the vocabulary index (-1 out of it) and the bucket both reach
    the graph, exactly, through index * buckets + bucket."""
    nodes = [helper.make_node("Squeeze", ["merchant", "axes"], ["flat"]),
             helper.make_node("StringToHashBucketFast", ["flat"], ["bucket"], name="lookup/oov", num_buckets=8),
             helper.make_node("CategoryMapper", ["flat"], ["index"], domain="ai.onnx.ml",
                              cats_strings=["car", "tv"], cats_int64s=[2, 3], default_int64=-1),
             helper.make_node("Mul", ["index", "hundred"], ["index_x100"]),
             helper.make_node("Add", ["index_x100", "bucket"], ["output_0"])]
    graph = helper.make_graph(
        nodes, "tf2onnx", [helper.make_tensor_value_info("merchant", TensorProto.STRING, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.INT64, ["n"])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"),
         numpy_helper.from_array(np.array(100, np.int64), "hundred")])
    raw = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])
    names = ["car", "tv", "yacht", "", "漢字", "a string longer than sixty-four bytes, so FarmHash takes its block path"]
    served, spec = shape_for_serving(raw)
    (feature,) = spec.categorical
    assert feature.kind == HASH and feature.vocabulary == {"car": 2, "tv": 3} and feature.default_index == -1
    decoded = RecordDecoder(spec).decode([json.dumps({"features": {"merchant": n}}).encode() for n in names])
    assert decoded.errors == (None,) * len(names)
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"categorical": decoded.categorical})[0]
    assert got.ravel().tolist() == [{"car": 2, "tv": 3}.get(n, -1) * 100 + hash_bucket(n, 8) for n in names]


def test_a_string_hashed_after_a_computation_or_looked_up_in_two_vocabularies_and_hashed_is_refused_naming_the_op():
    lower = helper.make_node("StringNormalizer", ["flat"], ["lower"], case_change_action="LOWER")
    after = helper.make_node("StringToHashBucketFast", ["lower"], ["bucket"], name="hashing/hash", num_buckets=8)
    with pytest.raises(ConversionError, match="op StringToHashBucketFast at node hashing/hash: no ONNX operator"):
        shape_for_serving(_hashing_model(lower, after))
    fast = helper.make_node("StringToHashBucketFast", ["flat"], ["bucket"], name="lookup/oov", num_buckets=8)
    tables = [helper.make_node("CategoryMapper", ["flat"], [f"index{i}"], domain="ai.onnx.ml", cats_strings=["a"],
                               cats_int64s=[i], default_int64=-1) for i in (1, 2)]
    with pytest.raises(ConversionError, match="op StringToHashBucketFast at node lookup/oov .* several vocabularies"):
        shape_for_serving(_hashing_model(fast, string_users=tables))
