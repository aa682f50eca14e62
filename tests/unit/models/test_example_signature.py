"""The tf.Example parsing lifted out of a converted graph, and the pieces of tf.Example parity, without TensorFlow."""
import json
import math

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.example_record import as_example
from s2t.backends.records.feature_spec import INTEGER, CategoricalFeature, FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder
from s2t.gate import example_parity
from s2t.models.convert import shape_for_serving
from s2t.models.example_signature import (DenseFeature, SignatureError, dense_features, lift_parse_example,
                                          lift_from_saved_model, read_dense_shapes)

EMPTY_TEXT = np.array([], dtype=object)


def parse_node(keys, defaults, sparse_keys=EMPTY_TEXT, num_sparse=0):
    """A ParseExampleV2 as tf2onnx leaves it: its keys and defaults as initializers."""
    initializers = {"names": EMPTY_TEXT, "sparse_keys": sparse_keys, "dense_keys": np.array(keys, dtype=object),
                    "ragged_keys": EMPTY_TEXT}
    for i, default in enumerate(defaults):
        initializers[f"default_{i}"] = default
    node = helper.make_node(
        "ParseExampleV2", ["examples", "names", "sparse_keys", "dense_keys", "ragged_keys"]
        + [f"default_{i}" for i in range(len(defaults))], [f"parsed_{i}" for i in range(len(keys))],
        name="ParseExample/ParseExampleV2", num_sparse=num_sparse)
    return node, initializers


REQUIRED_FLOAT = np.array([], dtype=np.float32)


@pytest.mark.parametrize("keys, defaults, shapes, expected", [
    (["amount"], [REQUIRED_FLOAT], {"amount": (1,)},
     (DenseFeature("amount", TensorProto.FLOAT, (1,), None),)),
    (["age", "purpose"], [np.array([30.0], np.float32), np.array(["other"], dtype=object)],
     {"age": (), "purpose": (1,)},
     (DenseFeature("age", TensorProto.FLOAT, (), 30.0), DenseFeature("purpose", TensorProto.STRING, (1,), "other"))),
    (["purpose"], [np.array([b"other"], dtype=object)], {"purpose": ()},
     (DenseFeature("purpose", TensorProto.STRING, (), "other"),)),
    (["branch", "rank"], [np.array([2 ** 40 + 7], np.int64), np.array([], np.int64)], {"branch": (1,), "rank": ()},
     (DenseFeature("branch", TensorProto.INT64, (1,), 2 ** 40 + 7), DenseFeature("rank", TensorProto.INT64, (), None))),
])
def test_parsed_features_come_from_the_keys_defaults_and_declared_shapes(keys, defaults, shapes, expected):
    node, initializers = parse_node(keys, defaults)
    features = dense_features(node, initializers, shapes)
    assert features == expected
    # An int64 default stays an integer: 2**40 + 7 as a float would still compare equal, its type would not.
    assert [type(f.default) for f in features] == [type(f.default) for f in expected]


@pytest.mark.parametrize("keys, defaults, shapes, sparse_keys, message", [
    (["amount"], [REQUIRED_FLOAT], {"amount": (2, 3)}, EMPTY_TEXT, "feature 'amount' has shape [2, 3] per example"),
    (["count"], [np.array([], np.float64)], {"count": (1,)}, EMPTY_TEXT, "feature 'count' is parsed as DOUBLE"),
    (["amount"], [REQUIRED_FLOAT], {}, EMPTY_TEXT, "declares no shape for feature 'amount'"),
    (["amount"], [np.array([1.0, 2.0], np.float32)], {"amount": (1,)}, EMPTY_TEXT,
     "feature 'amount' has a default of 2 values"),
])
def test_a_parse_that_a_record_cannot_feed_is_refused_naming_the_feature(keys, defaults, shapes, sparse_keys,
                                                                          message):
    node, initializers = parse_node(keys, defaults, sparse_keys)
    with pytest.raises(SignatureError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        dense_features(node, initializers, shapes)


def example_graph(amount_default=REQUIRED_FLOAT):
    """examples -> ParseExampleV2 (amount, purpose) -> purpose through a CategoryMapper, a tiny linear score."""
    node, initializers = parse_node(["amount", "purpose"], [amount_default, np.array(["other"], dtype=object)])
    mapper = helper.make_node("CategoryMapper", ["parsed_1"], ["index"], domain="ai.onnx.ml",
                              cats_strings=["car", "education"], cats_int64s=[0, 1], default_int64=2)
    nodes = [node, mapper,
             helper.make_node("Cast", ["index"], ["index_float"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["parsed_0", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "index_float"], ["logit"]),
             helper.make_node("Sigmoid", ["logit"], ["score"])]
    tensors = [numpy_helper.from_array(v, k) if v.dtype != object
               else helper.make_tensor(k, TensorProto.STRING, v.shape, [s.encode() for s in v])
               for k, v in initializers.items()] + [numpy_helper.from_array(np.array(0.001, np.float32), "scale")]
    graph = helper.make_graph(nodes, "example_model",
                              [helper.make_tensor_value_info("examples", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["n", 1])], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])


def test_the_lifted_graph_takes_the_parsed_features_and_serves_with_the_spec():
    model, features, example_input = lift_parse_example(example_graph(), {"amount": (1,), "purpose": (1,)})
    assert example_input == "examples"
    assert [(i.name, i.type.tensor_type.elem_type) for i in model.graph.input] == \
        [("amount", TensorProto.FLOAT), ("purpose", TensorProto.STRING)]
    assert not any(n.op_type == "ParseExampleV2" for n in model.graph.node)
    assert {i.name for i in model.graph.initializer} == {"scale"}

    served, spec = shape_for_serving(model, {"purpose": "other"})
    assert spec == FeatureSpec((CategoricalFeature("purpose", {"car": 0, "education": 1}, 2),), ("amount",),
                               {"purpose": "other"})
    session = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"])
    records = [example_parity.serialize_example(f) for f in
               ({"amount": 1500.0, "purpose": "education"}, {"amount": 1500.0, "purpose": "boat"}, {"amount": 200.0})]
    batch = RecordDecoder(spec).decode(records)
    scores = session.run(None, {"categorical": batch.categorical, "numeric": batch.numeric})[0].ravel()
    expected = [1 / (1 + math.exp(-(a * 0.001 + i))) for a, i in ((1500, 1), (1500, 2), (200, 2))]
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


def test_a_graph_without_a_parse_is_left_as_it_is():
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "plain", [helper.make_tensor_value_info("x", 1, ["n"])],
        [helper.make_tensor_value_info("y", 1, ["n"])]))
    assert lift_from_saved_model(model, {"dense_shapes": {}}) == (model, {}, {})


def test_what_the_runner_could_not_read_of_the_parse_is_refused_only_for_a_graph_that_parses():
    """The tf2onnx runner reads the dense shapes where TensorFlow is loaded; its reason comes back as the refusal."""
    found = {"error": "the dense keys of ParseExampleV2 are not a constant"}
    with pytest.raises(SignatureError, match="dense keys of ParseExampleV2 are not a constant"):
        lift_from_saved_model(example_graph(), found)
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "plain", [helper.make_tensor_value_info("x", 1, ["n"])],
        [helper.make_tensor_value_info("y", 1, ["n"])]))
    assert lift_from_saved_model(plain, found) == (plain, {}, {})
    # JSON lists become the shapes the lifting compares.
    assert read_dense_shapes({"dense_shapes": {"history": [3], "amount": []}}) == {"history": (3,), "amount": ()}


def test_a_signature_with_more_than_the_examples_is_refused():
    model = example_graph()
    model.graph.input.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["n"]))
    with pytest.raises(SignatureError, match="takes the serialized Examples"):
        lift_parse_example(model, {"amount": (1,), "purpose": (1,)})


SPEC = FeatureSpec((CategoricalFeature("purpose", {"car": 0}, 1),), ("amount", "age"), {"age": 30.0})


@pytest.mark.parametrize("cells, expected", [
    ({"amount": "1200", "age": "41", "purpose": "car", "creditability": "bad"},
     {"purpose": "car", "amount": 1200.0, "age": 41.0}),
    ({"amount": "-3.5e2", "age": "", "purpose": ""}, {"amount": -350.0}),
    ({"amount": "7", "age": None, "purpose": "a, b"}, {"purpose": "a, b", "amount": 7.0}),
])
def test_a_csv_row_becomes_the_features_of_one_example(cells, expected):
    assert example_parity.example_features(cells, SPEC) == expected


@pytest.mark.parametrize("cells, message", [
    ({"amount": "lots", "age": "3", "purpose": "car"}, "column amount: 'lots' is not a number"),
    ({"amount": "1", "age": "inf", "purpose": "car"}, "column age: 'inf' is not a finite float32 number"),
    ({"amount": "1e39", "age": "3", "purpose": "car"}, "column amount: '1e39' is not a finite float32 number"),
])
def test_a_cell_that_cannot_take_its_features_type_is_that_rows_error(cells, message):
    with pytest.raises(example_parity.RowError, match=message):
        example_parity.example_features(cells, SPEC)


INTEGER_SPEC = FeatureSpec((CategoricalFeature("branch", {}, 0, INTEGER), CategoricalFeature("purpose", {"car": 0}, 1)),
                           ("amount",), {"branch": -1})


@pytest.mark.parametrize("cells, expected", [
    ({"branch": "1099511627783", "purpose": "car", "amount": "3"}, {"branch": 2 ** 40 + 7, "purpose": "car",
                                                                    "amount": 3.0}),
    ({"branch": "-4", "purpose": "", "amount": "3"}, {"branch": -4, "amount": 3.0}),
    ({"branch": "", "amount": "3"}, {"amount": 3.0}),
])
def test_an_int64_column_becomes_an_integer_feature(cells, expected):
    features = example_parity.example_features(cells, INTEGER_SPEC)
    assert features == expected and all(type(features[k]) is type(v) for k, v in expected.items())
    assert as_example(example_parity.serialize_example(features)).features == features


def test_an_int64_cell_that_is_no_integer_is_that_rows_error():
    with pytest.raises(example_parity.RowError, match="column branch: '2.5' is not an integer"):
        example_parity.example_features({"branch": "2.5", "amount": "1"}, INTEGER_SPEC)


def test_a_built_example_decodes_as_the_same_record():
    features = {"purpose": "car", "amount": 1200.25, "age": 41.0}
    assert as_example(example_parity.serialize_example(features)).features == features


def test_the_decoder_gives_a_missing_feature_its_parse_default_and_refuses_one_without():
    decoder = RecordDecoder(SPEC)
    batch = decoder.decode([json.dumps({"features": {"purpose": "car", "amount": 5}}).encode(),
                            json.dumps({"features": {"purpose": "car", "age": 5}}).encode()])
    assert batch.numeric[0].tolist() == [5.0, 30.0]
    assert str(batch.errors[1]) == "features.amount: missing"


def test_a_spec_without_defaults_reads_and_writes_as_before():
    spec = FeatureSpec((CategoricalFeature("purpose", {"car": 0}, 1),), ("amount",))
    assert "defaults" not in json.loads(spec.to_json())
    assert FeatureSpec.from_json(spec.to_json()) == spec
    assert FeatureSpec.from_json(SPEC.to_json()) == SPEC


TF_MESSAGE = ("Graph execution error:\n\nDetected at node ParseExample/ParseExampleV2 defined at (most recent call "
              "last):\n<stack traces unavailable>\nName: <unknown>, Feature: amount (data type: float) is required but "
              "could not be found.\n\t [[{{node ParseExample/ParseExampleV2}}]] [Op:__inference_signature_wrapper_1]")


@pytest.mark.parametrize("message, reason", [
    (TF_MESSAGE, "Name: <unknown>, Feature: amount (data type: float) is required but could not be found."),
    ("Key: amount, Index: 0.  Data types don't match. [[{{node X}}]]",
     "Key: amount, Index: 0.  Data types don't match."),
    ("", "refused"),
])
def test_tensorflows_reason_is_the_line_about_the_input(message, reason):
    assert example_parity.tensorflow_reason(message) == reason


@pytest.mark.parametrize("reference, outcomes, rows, compared, over, worst", [
    ([0.1, 0.2, 0.3], [0.1, 0.2, 0.3], [0, 1, 2], 3, [], 0),
    (["refused", 0.2, 0.3], ["missing", 0.2, 0.5], [4, 5, 6], 2, [6], 6),  # both refused: left out
    ([0.1, "refused", 0.3], [0.1, 0.7, 0.3], [0, 2, 3], 3, [2], 2),  # scored by one side only: a mismatch
    (["a", "b"], ["c", "d"], [0, 1], 0, [], -1),
])
def test_outcomes_compare_on_the_rows_some_side_scored_with_csv_row_numbers(reference, outcomes, rows, compared,
                                                                             over, worst):
    result = example_parity.compare_outcomes("candidate", reference, outcomes, rows, 1e-5)
    assert (result.rows, result.over_tolerance, result.worst_row) == (compared, over, worst)
    assert result.passed == (not over)


def test_each_row_not_built_or_refused_gets_one_line_naming_each_sides_reason():
    rows = [example_parity.ExampleRow(0, b"a"), example_parity.ExampleRow(1, None, "column amount: 'x' is not a "
                                                                                  "number"),
            example_parity.ExampleRow(2, b"b")]
    lines = example_parity.row_error_lines(rows, {"legacy": [0.5, "required"], "triton": [0.5, "features.a: missing"]})
    assert lines == ["row 1: not sent (column amount: 'x' is not a number)",
                     "row 2: refused by legacy: required; triton: features.a: missing"]


@given(st.dictionaries(st.text(min_size=1, max_size=20),
                       st.one_of(st.text(max_size=30), st.floats(width=32, allow_nan=False, allow_infinity=False)),
                       min_size=1, max_size=8))
def test_any_built_example_decodes_to_the_same_features(features):
    assert as_example(example_parity.serialize_example(features)).features == features


def test_a_feature_with_a_parse_default_may_have_no_column(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("amount,purpose\n12,car\n")
    rows = example_parity.examples_from_csv(data, SPEC)
    assert as_example(rows[0].example).features == {"amount": 12.0, "purpose": "car"}
    data.write_text("age,purpose\n12,car\n")
    with pytest.raises(ValueError, match="no column for features amount"):
        example_parity.examples_from_csv(data, SPEC)


def test_a_legacy_parse_example_op_is_refused_with_the_way_to_export_it():
    from s2t.models.convert import _way_out
    assert "tf.io.parse_example (ParseExampleV2)" in _way_out("ParseExample")


@pytest.mark.parametrize("keys, defaults, shapes, expected", [
    (["history"], [np.array([1.0, 2.0, 3.0], np.float32)], {"history": (3,)},
     (DenseFeature("history", TensorProto.FLOAT, (3,), (1.0, 2.0, 3.0)),)),
    (["codes"], [np.array([], np.int64)], {"codes": (2,)}, (DenseFeature("codes", TensorProto.INT64, (2,), None),)),
])
def test_a_feature_of_several_values_per_example_is_lifted_with_its_defaults(keys, defaults, shapes, expected):
    node, initializers = parse_node(keys, defaults)
    assert dense_features(node, initializers, shapes) == expected
