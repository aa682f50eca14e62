import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.scoring.ort_runner import CONFIG_DTYPES, ModelConfigError, OrtRunner, OrtSettings, TensorSpec

TABLE = np.array([[10.0], [20.0], [30.0]], dtype=np.float32)


@pytest.fixture(scope="module")
def lookup_model(tmp_path_factory):
    """y = TABLE[index] + x: a Gather that fails on an out-of-range index, like a bad vocabulary index would."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "index"], ["row"], axis=0),
         helper.make_node("Reshape", ["row", "shape"], ["flat"]),
         helper.make_node("Add", ["flat", "x"], ["y"])],
        "lookup",
        [helper.make_tensor_value_info("index", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(np.array([-1, 1], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    path = tmp_path_factory.mktemp("ort") / "model.onnx"
    onnx.save(model, str(path))
    return path


def runner(path, **kwargs):
    return OrtRunner(path, OrtSettings(intra_op_thread_count=1),
                     [TensorSpec("index", np.int64), TensorSpec("x", np.float32)], [TensorSpec("y", np.float32)],
                     **kwargs)


def request(indices, xs):
    return {"index": np.array(indices, np.int64), "x": np.array(xs, np.float32).reshape(-1, 1)}


def test_batched_run_gives_each_request_its_own_rows(lookup_model):
    results = runner(lookup_model).run([request([0], [1]), request([1, 2], [2, 3]), request([2], [0.5])])
    assert [r[0].ravel().tolist() for r in results] == [[11.0], [22.0, 33.0], [30.5]]


def test_faulty_request_gets_its_error_and_batch_mates_their_answers(lookup_model):
    results = runner(lookup_model).run([request([0], [1]), request([7], [0]), request([2], [1])])
    assert isinstance(results[1], Exception)
    assert "out of" in str(results[1]) or "indices" in str(results[1])
    assert results[0][0].ravel().tolist() == [11.0]
    assert results[2][0].ravel().tolist() == [31.0]


def test_unbatched_model_runs_requests_one_by_one(lookup_model):
    results = runner(lookup_model, batched=False).run([request([0], [1]), request([1], [1])])
    assert [r[0].ravel().tolist() for r in results] == [[11.0], [21.0]]


def test_config_naming_a_tensor_the_model_lacks_refuses_to_load(lookup_model):
    with pytest.raises(ModelConfigError, match="'probability' is not in the model"):
        OrtRunner(lookup_model, OrtSettings(), [TensorSpec("index", np.int64), TensorSpec("x", np.float32)],
                  [TensorSpec("probability", np.float32)])


def test_config_dtype_differing_from_the_model_refuses_to_load(lookup_model):
    with pytest.raises(ModelConfigError, match="'index' is int32, the model says tensor\\(int64\\)"):
        OrtRunner(lookup_model, OrtSettings(), [TensorSpec("index", np.int32), TensorSpec("x", np.float32)],
                  [TensorSpec("y", np.float32)])


def test_missing_model_file_refuses_to_load(tmp_path):
    with pytest.raises(ModelConfigError, match="model file not found"):
        runner(tmp_path / "model.onnx")


@pytest.mark.parametrize("parameters, expected", [
    ({}, OrtSettings(0, 0, False)),
    ({"intra_op_thread_count": {"string_value": "1"}}, OrtSettings(1, 0, False)),
    ({"inter_op_thread_count": {"string_value": "2"}, "execution_mode": {"string_value": "1"}},
     OrtSettings(0, 2, True)),
])
def test_settings_read_the_native_backend_parameter_names(parameters, expected):
    assert read_parameters(OrtSettings, parameters, ModelConfigError) == expected


@pytest.mark.parametrize("value", ["two", "-1"])
def test_bad_thread_count_refuses_to_load(value):
    with pytest.raises(ModelConfigError, match="intra_op_thread_count"):
        read_parameters(OrtSettings, {"intra_op_thread_count": {"string_value": value}}, ModelConfigError)


def test_string_tensors_are_decoded_for_onnx_runtime(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "strings",
                              [helper.make_tensor_value_info("s", TensorProto.STRING, ["batch", 1])],
                              [helper.make_tensor_value_info("t", TensorProto.STRING, ["batch", 1])])
    path = tmp_path / "strings.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(path))
    run = OrtRunner(path, OrtSettings(), [TensorSpec("s", CONFIG_DTYPES["TYPE_STRING"])],
                    [TensorSpec("t", CONFIG_DTYPES["TYPE_STRING"])])
    out = run.run([{"s": np.array([[b"caf\xc3\xa9"]], dtype=object)}])[0][0]
    assert out.ravel().tolist() == ["café"]
