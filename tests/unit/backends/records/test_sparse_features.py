"""Sparse (tf.io.VarLenFeature) and ragged (tf.io.RaggedFeature) tf.Example features: the decoder pads a record's
values to the feature's limit and counts them; the lifted graph rebuilds from those exactly the tensors TensorFlow's
parse gives."""
import json

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.feature_spec import INTEGER, CategoricalFeature, FeatureSpec, count_column, sparse_columns
from s2t.backends.records.record_decoder import RecordDecoder, sparse_padding, spread_sparse
from s2t.gate import example_parity
from s2t.models.convert import ConversionError, parse_max_values
from s2t.models.example_signature import SignatureError, SparseFeature, lift_parse_example, sparse_features

VOCABULARY = {"car": 0, "education": 1}
# tags: strings, at most 3; ids: int64, at most 2; amounts: float32, at most 1 (its one column is the key itself).
SPEC = FeatureSpec(
    (*(CategoricalFeature(c, VOCABULARY, 2) for c in sparse_columns("tags", 3)),
     CategoricalFeature("tags/count", {}, 0, INTEGER),
     *(CategoricalFeature(c, {}, 0, INTEGER) for c in sparse_columns("ids", 2)),
     CategoricalFeature("ids/count", {}, 0, INTEGER), CategoricalFeature("amounts/count", {}, 0, INTEGER)),
    ("amounts", "age"), sparse={"tags": 3, "ids": 2, "amounts": 1})


def _decode(features: dict):
    return RecordDecoder(SPEC).decode([json.dumps({"features": features}).encode()])


@pytest.mark.parametrize("features, categorical, numeric", [
    # left out, null or an empty list: no value (TensorFlow parses all three the same)
    ({"age": 30}, [2, 2, 2, 0, 0, 0, 0, 0], [0.0, 30.0]),
    ({"age": 30, "tags": None, "ids": [], "amounts": []}, [2, 2, 2, 0, 0, 0, 0, 0], [0.0, 30.0]),
    # one value, as a list or on its own (a SkillRecord or a tf.Example of one value)
    ({"age": 30, "tags": "car"}, [0, 2, 2, 1, 0, 0, 0, 0], [0.0, 30.0]),
    ({"age": 30, "tags": ["education"], "amounts": 2.5}, [1, 2, 2, 1, 0, 0, 0, 1], [2.5, 30.0]),
    # up to the limit, out-of-vocabulary values as the legacy lookup takes them
    ({"age": 30, "tags": ["car", "yacht", "education"]}, [0, 2, 1, 3, 0, 0, 0, 0], [0.0, 30.0]),
    ({"age": 30, "ids": [2 ** 62, -7]}, [2, 2, 2, 0, 2 ** 62, -7, 2, 0], [0.0, 30.0]),
])
def test_a_sparse_feature_is_its_values_padded_to_the_limit_and_its_count(features, categorical, numeric):
    batch = _decode(features)
    assert batch.errors == (None,)
    assert batch.categorical.tolist() == [categorical] and batch.numeric.tolist() == [numeric]


@pytest.mark.parametrize("features, message", [
    ({"age": 30, "tags": ["car"] * 4}, "features.tags: 4 values is over the limit of 3 for this sparse feature"),
    ({"age": 30, "amounts": [1.0, 2.0]}, "features.amounts: 2 values is over the limit of 1"),
    ({"age": 30, "ids": [1.5]}, "features.ids/0: expected an integer, got number"),
    ({"age": 30, "ids": [1, "2"]}, "features.ids/1: expected an integer, got string"),
    ({"age": 30, "tags": [["car"]]}, "features.tags/0: expected a string, got array"),
    ({"age": 30, "tags": {"car": 1}}, "features.tags/0: expected a string, got object"),
    ({"age": 30, "amounts": ["x"]}, "features.amounts: expected a number, got string"),
    ({"tags": ["car"]}, "features.age: missing"),
])
def test_a_sparse_feature_a_record_cannot_carry_is_that_records_error_naming_it(features, message):
    good = {"age": 40, "tags": ["car", "car"]}
    batch = RecordDecoder(SPEC).decode([json.dumps({"features": f}).encode() for f in (good, features, good)])
    assert batch.errors[0] is None and batch.errors[2] is None
    assert str(batch.errors[1]).startswith(message)
    assert batch.categorical[0].tolist() == batch.categorical[2].tolist() == [0, 0, 2, 2, 0, 0, 0, 0]


def test_the_limit_refuses_a_tf_example_as_it_refuses_a_json_record():
    over = example_parity.serialize_example({"age": 30.0, "tags": ["car"] * 5})
    empty = example_parity.serialize_example({"age": 30.0, "tags": [], "ids": []})
    batch = RecordDecoder(SPEC).decode([over, empty])
    assert str(batch.errors[0]) == ("features.tags: 5 values is over the limit of 3 for this sparse feature (the most "
                                    "values per record it was converted with)")
    assert batch.errors[1] is None and batch.categorical[1].tolist() == [2, 2, 2, 0, 0, 0, 0, 0]


TAGS = st.lists(st.sampled_from(["car", "education", "yacht", "", "é漢😀"]), max_size=3)
IDS = st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), max_size=2)


@settings(max_examples=200, deadline=None)
@given(tags=st.one_of(st.none(), TAGS), ids=st.one_of(st.none(), IDS),
       amounts=st.one_of(st.none(), st.lists(st.floats(-1e6, 1e6, width=32), max_size=1)))
def test_json_and_tf_example_records_decode_to_the_values_and_their_count(tags, ids, amounts):
    features = {"age": 30.0, **{k: v for k, v in (("tags", tags), ("ids", ids), ("amounts", amounts))
                                if v is not None}}
    from_json, from_example = (RecordDecoder(SPEC).decode([payload]) for payload in (
        json.dumps({"features": features}).encode(), example_parity.serialize_example(features)))
    assert from_json.errors == from_example.errors == (None,)
    np.testing.assert_array_equal(from_json.categorical, from_example.categorical)
    np.testing.assert_array_equal(from_json.numeric, from_example.numeric)
    row = dict(zip([f.name for f in SPEC.categorical], from_json.categorical[0].tolist()))
    tags, ids, amounts = tags or [], ids or [], amounts or []
    assert row["tags/count"] == len(tags) and row["ids/count"] == len(ids) and row["amounts/count"] == len(amounts)
    assert [row[c] for c in sparse_columns("tags", 3)[:len(tags)]] == [VOCABULARY.get(t, 2) for t in tags]
    assert [row[c] for c in sparse_columns("ids", 2)[:len(ids)]] == ids
    assert from_json.numeric[0, 0] == (np.float32(amounts[0]) if amounts else 0.0)


def test_padding_takes_each_columns_type():
    assert sparse_padding(SPEC) == {"tags/0": "", "tags/1": "", "tags/2": "", "ids/0": 0, "ids/1": 0, "amounts": 0.0}
    assert spread_sparse({"ids": 5}, {"ids": 2}, {"ids/0": 0, "ids/1": 0}) == {"ids/0": 5, "ids/1": 0, "ids/count": 1}


def test_a_spec_with_sparse_features_reads_back_as_written_and_names_them_once():
    assert FeatureSpec.from_json(SPEC.to_json()) == SPEC
    assert SPEC.keys == ("tags", "ids", "amounts", "age")
    raw = json.loads(SPEC.to_json())
    raw["sparse"]["tags"] = 0
    with pytest.raises(ValueError, match="sparse feature 'tags': the most values per record must be a positive"):
        FeatureSpec.from_json(json.dumps(raw))


@pytest.mark.parametrize("cell, expected", [("car yacht", ["car", "yacht"]), ("[]", []), ("car", ["car"])])
def test_a_csv_cell_of_a_sparse_feature_is_its_list(cell, expected):
    assert example_parity.example_features({"tags": cell, "age": "3"}, SPEC) == {"tags": expected, "age": 3.0}
    assert example_parity.example_features({"age": "3", "tags": ""}, SPEC) == {"age": 3.0}


@pytest.mark.parametrize("options, expected", [
    ((), {}), (("tags=4",), {"tags": 4}), (("a=b=2", "ids=1"), {"a=b": 2, "ids": 1}),
])
def test_max_values_options_name_each_feature_once(options, expected):
    assert parse_max_values(options) == expected


@pytest.mark.parametrize("options", [("tags",), ("tags=0",), ("tags=-1",), ("=3",), ("tags=x",), ("t=1", "t=2")])
def test_a_malformed_max_values_option_is_refused_naming_it(options):
    with pytest.raises(ConversionError, match="--max-values"):
        parse_max_values(options)


def _text(values) -> np.ndarray:
    return np.array(values, dtype=object)


OUTPUT_TYPES = {"tags_values": TensorProto.STRING, "age": TensorProto.FLOAT, "amounts_values": TensorProto.FLOAT,
                "amounts_splits": TensorProto.INT32}


def _parse_graph():
    """examples -> ParseExampleV2 (sparse ids int64 and tags string, dense age, ragged amounts float32 with int32
    row splits), each output returned through an Identity, as tf2onnx leaves such a parse."""
    initializers = {"names": _text([]), "sparse_keys": _text(["ids", "tags"]), "dense_keys": _text(["age"]),
                    "ragged_keys": _text(["amounts"]), "age_default": np.array([], np.float32)}
    outputs = ["ids_indices", "tags_indices", "ids_values", "tags_values", "ids_shape", "tags_shape", "age",
               "amounts_values", "amounts_splits"]
    parse = helper.make_node(
        "ParseExampleV2", ["examples", "names", "sparse_keys", "dense_keys", "ragged_keys", "age_default"],
        [f"parsed_{o}" for o in outputs], name="ParseExample/ParseExampleV2", num_sparse=2,
        sparse_types=[TensorProto.INT64, TensorProto.STRING], ragged_value_types=[TensorProto.FLOAT],
        ragged_split_types=[TensorProto.INT32])
    nodes = [parse] + [helper.make_node("Identity", [f"parsed_{o}"], [f"out_{o}"]) for o in outputs]
    tensors = [numpy_helper.from_array(v, k) if v.dtype != object
               else helper.make_tensor(k, TensorProto.STRING, v.shape, [s.encode() for s in v])
               for k, v in initializers.items()]
    graph = helper.make_graph(nodes, "parse", [helper.make_tensor_value_info("examples", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info(f"out_{o}", OUTPUT_TYPES.get(o, TensorProto.INT64), None)
                               for o in outputs],
                              tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), outputs


MOST = {"ids": 3, "tags": 2, "amounts": 4}


def _records(rng, n):
    records = []
    for i in range(n):
        record = {"age": float(i)}
        for key, most in MOST.items():
            count = int(rng.integers(0, most + 1))
            if i % 5 == 4:
                continue  # left out: no value
            record[key] = ([int(v) for v in rng.integers(-2 ** 40, 2 ** 40, count)] if key == "ids" else
                           [str(rng.choice(["car", "x", "é漢"])) for _ in range(count)] if key == "tags" else
                           [float(np.float32(v)) for v in rng.uniform(-9, 9, count)])
        records.append(record)
    return records


@pytest.mark.parametrize("batch", [[], [{"age": 1.0}], [{"age": 1.0, "ids": [], "tags": []}]] +
                         [_records(np.random.default_rng(seed), 24) for seed in range(3)],
                         ids=["nothing", "one_record_no_values", "empty_lists", "seed0", "seed1", "seed2"])
def test_the_rebuilt_sparse_and_ragged_tensors_are_tensorflows_parse(batch):
    """Every tensor TensorFlow's own parse gives (indices in its order, values, dense shape of the batch's widest
    record, ragged row splits), rebuilt by the lifted graph from the decoder's padded columns and counts."""
    import tensorflow as tf

    model, outputs = _parse_graph()
    lifted, features, _ = lift_parse_example(model, {"age": ()}, MOST)
    assert [(f.key, f.most) for f in features if isinstance(f, SparseFeature)] == list(MOST.items())
    examples = [example_parity.serialize_example(r) for r in batch]
    parsed = tf.io.parse_example(tf.constant(examples, tf.string), {
        "ids": tf.io.VarLenFeature(tf.int64), "tags": tf.io.VarLenFeature(tf.string),
        "age": tf.io.FixedLenFeature([], tf.float32), "amounts": tf.io.RaggedFeature(tf.float32)})
    expected = {f"{key}_{part}": getattr(parsed[key], attr).numpy() for key in ("ids", "tags")
                for part, attr in (("indices", "indices"), ("values", "values"), ("shape", "dense_shape"))}
    expected.update(age=parsed["age"].numpy(), amounts_values=parsed["amounts"].values.numpy(),
                    amounts_splits=parsed["amounts"].row_splits.numpy())

    padding = {**{c: 0 for c in sparse_columns("ids", 3)}, **{c: "" for c in sparse_columns("tags", 2)},
               **{c: 0.0 for c in sparse_columns("amounts", 4)}}
    spread = [spread_sparse(r, MOST, padding) for r in batch]
    types = {"ids": np.int64, "tags": object, "amounts": np.float32}
    feeds = {"age": np.array([r["age"] for r in batch], np.float32)}
    for key, most in MOST.items():
        feeds[key] = np.array([[r[c] for c in sparse_columns(key, most)] for r in spread], types[key]).reshape(-1, most)
        feeds[count_column(key)] = np.array([r[count_column(key)] for r in spread], np.int64)
    session = ort.InferenceSession(lifted.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip(outputs, session.run([f"out_{o}" for o in outputs],
                                        {i.name: feeds[i.name] for i in session.get_inputs()})))
    for name in outputs:
        assert got[name].dtype == expected[name].dtype or name.endswith("values") and name.startswith("tags"), name
        assert got[name].shape == expected[name].shape, name
        assert got[name].tolist() == [v.decode() if isinstance(v, bytes) else v for v in expected[name].tolist()] \
            if name == "tags_values" else got[name].tolist() == expected[name].tolist(), name


def test_a_sparse_feature_without_its_limit_is_refused_naming_the_option():
    model, _ = _parse_graph()
    with pytest.raises(SignatureError, match=r"sparse \(VarLenFeature\) feature 'ids' needs the most values a record "
                                             r"may carry: convert with --max-values ids=N"):
        lift_parse_example(model, {"age": ()}, {"tags": 2, "amounts": 1})
    with pytest.raises(SignatureError, match=r"ragged \(RaggedFeature\) feature 'amounts' needs"):
        lift_parse_example(model, {"age": ()}, {"tags": 2, "ids": 1})


def test_a_limit_for_a_feature_the_signature_does_not_parse_sparse_is_refused():
    model, _ = _parse_graph()
    node = next(n for n in model.graph.node if n.op_type == "ParseExampleV2")
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with pytest.raises(SignatureError, match="--max-values names age, which the signature does not parse"):
        sparse_features(node, initializers, {**MOST, "age": 2})
