import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.record_decoder import encode_columns
from s2t.models.convert import _UNSUPPORTED_OP, ConversionError, read_spec, refusal_in_log, shape_for_serving


def tf2onnx_like_model(extra_string_consumer=False):
    """What tf2onnx makes of StringLookup + Normalization: CategoryMapper -> one-hot Gather, Sub/Mul, MatMul."""
    nodes = [
        helper.make_node("CategoryMapper", ["housing"], ["lookup:0"], domain="ai.onnx.ml",
                         cats_strings=["own", "rent"], cats_int64s=[1, 2], default_int64=0),
        helper.make_node("Reshape", ["lookup:0", "flat"], ["ids"]),
        helper.make_node("Gather", ["eye", "ids"], ["onehot"], axis=0),
        helper.make_node("Sub", ["age", "mean"], ["centred"]),
        helper.make_node("Concat", ["onehot", "centred"], ["features"], axis=1),
        helper.make_node("MatMul", ["features", "w"], ["output_0"]),
    ]
    if extra_string_consumer:
        nodes.append(helper.make_node("Identity", ["housing"], ["copy"]))
    graph = helper.make_graph(
        nodes, "tf2onnx",
        [helper.make_tensor_value_info("housing", TensorProto.STRING, ["unk__1", 1]),
         helper.make_tensor_value_info("age", TensorProto.FLOAT, ["unk__2", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["unk__3", 1])],
        [numpy_helper.from_array(np.array([-1], np.int64), "flat"),
         numpy_helper.from_array(np.eye(3, dtype=np.float32), "eye"),
         numpy_helper.from_array(np.array([40.0], np.float32), "mean"),
         numpy_helper.from_array(np.array([[0.1], [0.2], [0.3], [0.01]], np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])


def test_lookups_are_lifted_into_the_spec_and_scores_do_not_change():
    raw = tf2onnx_like_model()
    columns = {"housing": np.array(["own", "rent", "castle"], dtype=object),
               "age": np.array([30.0, 50.0, 41.5], dtype=np.float32)}
    expected = ort.InferenceSession(raw.SerializeToString()).run(
        None, {"housing": columns["housing"].reshape(-1, 1), "age": columns["age"].reshape(-1, 1)})[0]

    served, spec = shape_for_serving(raw)

    assert [i.name for i in served.graph.input] == ["categorical", "numeric"]
    assert [o.name for o in served.graph.output] == ["probability"]
    assert spec.categorical[0].vocabulary == {"own": 1, "rent": 2} and spec.categorical[0].default_index == 0
    assert spec.numeric == ("age",)
    assert read_spec(served) == spec
    assert not any(n.op_type == "CategoryMapper" for n in served.graph.node)
    categorical, numeric = encode_columns(spec, columns)
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"categorical": categorical, "numeric": numeric})[0]
    np.testing.assert_array_equal(got, expected)


def test_string_input_used_other_than_by_a_lookup_is_refused_with_its_op():
    with pytest.raises(ConversionError, match="string input 'housing' feeds CategoryMapper, Identity"):
        shape_for_serving(tf2onnx_like_model(extra_string_consumer=True))


def test_model_without_a_spec_is_refused_by_read_spec():
    with pytest.raises(ConversionError, match="convert it with `s2t convert`"):
        read_spec(tf2onnx_like_model())


def test_tf2onnx_unsupported_op_lines_are_parsed_into_op_and_node():
    line = "2026-11-29 16:42:51,542 - ERROR - Tensorflow op [PartitionedCall/Lgamma: Lgamma] is not supported"
    match = _UNSUPPORTED_OP.search(line)
    assert (match["node"], match["op"]) == ("PartitionedCall/Lgamma", "Lgamma")


def lookups_behind_reshapes_and_int64_keys():
    """What tf2onnx (with s2t's handlers) makes of Keras StringLookup on a squeezed input and of an int64-keyed table:
    string -> Squeeze -> CategoryMapper, and int64 -> Cast to text -> CategoryMapper of the keys' decimal text."""
    nodes = [
        helper.make_node("Squeeze", ["purpose", "axis"], ["purpose_flat"]),
        helper.make_node("CategoryMapper", ["purpose_flat"], ["purpose_index"], domain="ai.onnx.ml",
                         cats_strings=["car", "boat"], cats_int64s=[1, 2], default_int64=0),
        helper.make_node("Cast", ["branch"], ["branch_text"], to=TensorProto.STRING),
        helper.make_node("CategoryMapper", ["branch_text"], ["branch_value"], domain="ai.onnx.ml",
                         cats_strings=[str(2 ** 40 + 7), "-3"], cats_int64s=[5, 6], default_int64=9),
        helper.make_node("Unsqueeze", ["purpose_index", "axis"], ["purpose_column"]),
        helper.make_node("Add", ["purpose_column", "branch_value"], ["sum"]),
        helper.make_node("Cast", ["sum"], ["output_0"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "tf2onnx",
        [helper.make_tensor_value_info("purpose", TensorProto.STRING, ["n", 1]),
         helper.make_tensor_value_info("branch", TensorProto.INT64, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axis")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])


def test_lookups_behind_reshapes_and_int64_inputs_are_packed_and_score_as_before():
    raw = lookups_behind_reshapes_and_int64_keys()
    purposes = np.array([["car"], ["boat"], ["yacht"], ["car"]], dtype=object)
    branches = np.array([[2 ** 40 + 7], [2 ** 40 + 8], [-3], [7]], dtype=np.int64)
    expected = ort.InferenceSession(raw.SerializeToString()).run(None, {"purpose": purposes, "branch": branches})[0]

    served, spec = shape_for_serving(raw)

    assert [(f.name, f.kind) for f in spec.categorical] == [("purpose", "vocabulary"), ("branch", "integer")]
    assert spec.categorical[0].vocabulary == {"car": 1, "boat": 2}
    categorical, _ = encode_columns(spec, {"purpose": purposes.ravel(), "branch": branches.ravel()})
    assert categorical[:, 1].tolist() == branches.ravel().tolist()  # the integers themselves, exact
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"categorical": categorical})[0]
    np.testing.assert_array_equal(got, expected)
    assert expected.ravel().tolist() == [1 + 5, 2 + 9, 0 + 6, 1 + 9]


HANDLER_FAILURE = """2026-12-01 15:45:48,158 - ERROR - Failed to convert node 'StatefulPartitionedCall/None_Lookup/LookupTableFindV2' (fct=<bound method LookupTableFind.version_8 of <class 'tf2onnx.custom_opsets.onnx_ml.LookupTableFind'>>)
'OP=LookupTableFindV2\\nName=StatefulPartitionedCall/None_Lookup/LookupTableFindV2\\nInputs:\\n'
Traceback (most recent call last):
ValueError: make_sure failure: Only lookup tables of type string<->int64 are currently supported.
"""


@pytest.mark.parametrize("log, returncode, expected", [
    ("s2t-refusal|LookupTableFindV2|model/lookup|its keys are FLOAT|look up strings or integers\n", 3,
     "op LookupTableFindV2 at node model/lookup cannot be converted exactly: its keys are FLOAT; look up strings"),
    (HANDLER_FAILURE, 1, "op LookupTableFindV2 at node StatefulPartitionedCall/None_Lookup/LookupTableFindV2 cannot be "
                         "converted by tf2onnx: move the op out"),
    ("ERROR - Tensorflow op [model/hashing/hash: StringToHashBucketFast] is not supported", 1,
     "op StringToHashBucketFast at node model/hashing/hash: no ONNX operator computes TensorFlow's string hash"),
    ("ERROR - Tensorflow op [p/ParseExampleV2: ParseExampleV2] is not supported", 0, None),  # lifted by s2t convert
    ("all fine", 0, None),
])
def test_what_tf2onnx_could_not_convert_is_refused_in_s2ts_words(log, returncode, expected):
    refused = refusal_in_log(log, returncode, frozenset({"ParseExampleV2"}))
    if expected is None:
        assert refused is None
    else:
        assert expected in str(refused)
        assert "make_sure" not in str(refused)


def one_string_in_two_tables():
    """purpose looked up in two tables (a risk weight by position and a group id), as models that mix a Keras
    lookup and a StaticHashTable on the same feature hold."""
    nodes = [
        helper.make_node("CategoryMapper", ["purpose"], ["position"], domain="ai.onnx.ml",
                         cats_strings=["car", "boat", "tv"], cats_int64s=[0, 1, 2], default_int64=3),
        helper.make_node("Gather", ["weights", "position"], ["weight"], axis=0),
        helper.make_node("CategoryMapper", ["purpose"], ["group"], domain="ai.onnx.ml",
                         cats_strings=["tv", "house"], cats_int64s=[7, 8], default_int64=-1),
        helper.make_node("Cast", ["group"], ["group_float"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["weight", "group_float"], ["output_0"]),
    ]
    graph = helper.make_graph(
        nodes, "tf2onnx", [helper.make_tensor_value_info("purpose", TensorProto.STRING, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n", 1])],
        [numpy_helper.from_array(np.array([0.25, 0.5, 0.75, 0.125], np.float32), "weights")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])


def test_one_string_in_several_tables_is_lifted_to_one_shared_index_and_scores_as_before():
    raw = one_string_in_two_tables()
    purposes = np.array([["car"], ["tv"], ["house"], ["yacht"], ["boat"]], dtype=object)
    expected = ort.InferenceSession(raw.SerializeToString()).run(None, {"purpose": purposes})[0]

    served, spec = shape_for_serving(raw)

    assert spec.categorical[0].vocabulary == {"car": 0, "boat": 1, "tv": 2, "house": 3}
    assert spec.categorical[0].default_index == 4
    assert not any(n.op_type == "CategoryMapper" for n in served.graph.node)
    categorical, _ = encode_columns(spec, {"purpose": purposes.ravel()})
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"categorical": categorical})[0]
    np.testing.assert_array_equal(got, expected)
    assert expected.ravel().tolist() == [0.25 - 1, 0.75 + 7, 0.125 + 8, 0.125 - 1, 0.5 - 1]


def test_an_input_of_several_values_per_record_takes_that_many_columns():
    """history [n, 3] (a FixedLenFeature([3])) beside age [n, 1]: columns history/0..2 and age, the graph unchanged."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["history"], ["total"], axes=[1], keepdims=1),
         helper.make_node("Add", ["total", "age"], ["output_0"])], "tf2onnx",
        [helper.make_tensor_value_info("history", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("age", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n", 1])])
    raw = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    history = np.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], np.float32)
    age = np.array([[0.5], [0.25]], np.float32)
    expected = ort.InferenceSession(raw.SerializeToString()).run(None, {"history": history, "age": age})[0]

    served, spec = shape_for_serving(raw)

    assert spec.numeric == ("history/0", "history/1", "history/2", "age") and spec.values == {"history": 3}
    got = ort.InferenceSession(served.SerializeToString()).run(None, {"numeric": np.hstack([history, age])})[0]
    np.testing.assert_array_equal(got, expected)
    assert expected.ravel().tolist() == [7.5, 56.25]
