"""The legacy model honours the contract; `s2t convert` gives the served names or a clear refusal."""
import json
import os
import re
import subprocess

import numpy as np
import onnx
import pytest

from s2t.gate import parity

from s2t.models import legacy_model
from tests.conftest import S2T

TF_QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def signature(built_artifacts):
    import tensorflow as tf
    sig = tf.saved_model.load(str(built_artifacts["saved_model"])).signatures["serving_default"]
    return sig.structured_input_signature[1], sig.structured_outputs


def test_signature_has_one_input_per_german_credit_attribute(signature, german_credit_data):
    import tensorflow as tf
    inputs, outputs = signature
    assert set(inputs) == set(german_credit_data.columns)
    strings = {n for n, s in inputs.items() if s.dtype == tf.string}
    floats = {n for n, s in inputs.items() if s.dtype == tf.float32}
    assert strings == set(german_credit_data.categorical) and len(strings) == 13
    assert floats == set(german_credit_data.numeric) and len(floats) == 7
    assert all(s.shape.as_list() in ([None], [None, 1]) for s in inputs.values())
    assert [o.shape.as_list() for o in outputs.values()] == [[None, 1]]


def test_training_report_compares_with_logistic_regression(built_artifacts):
    report = json.loads((built_artifacts["saved_model"] / "training_report.json").read_text())
    assert 0.5 < report["logistic_regression_auc"] < 1
    assert report["beats_baseline"] == (report["holdout_auc"] > report["logistic_regression_auc"])
    assert report["rows_train"] + report["rows_holdout"] == 1000


def test_training_is_deterministic(built_artifacts, german_credit_data, legacy_scores, tmp_path):
    rebuilt = tmp_path / "risk_model"
    legacy_model.build(built_artifacts["data"], rebuilt)
    first = legacy_scores
    second = parity.legacy_scores(rebuilt, german_credit_data.columns)
    np.testing.assert_array_equal(first, second)


def test_convert_command_gives_the_served_tensor_names(built_artifacts, tmp_path):
    out = tmp_path / "scorer.onnx"
    done = subprocess.run([str(S2T), "convert", str(built_artifacts["saved_model"]), str(out), "--opset", "17"],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode == 0, done.stderr
    model = onnx.load(str(out))
    assert [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input] \
        == [("categorical", ["batch", 13]), ("numeric", ["batch", 7])]
    assert [o.name for o in model.graph.output] == ["probability"]
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    assert re.search(r"converting .* with tf2onnx \(opset 17\): \d+\.\d s", done.stderr), done.stderr


def test_the_converted_scorer_is_a_numeric_core_that_tensorrt_takes_whole(built_artifacts):
    from s2t.models import tensorrt_engine
    assert tensorrt_engine.tensorrt_blockers(onnx.load(str(built_artifacts["onnx"]))) == []


def test_unconvertible_op_is_named_with_its_node_and_a_way_out(tmp_path):
    import tensorflow as tf

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.math.lgamma(x)}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "lgamma"), signatures={"serving_default": model.serve})
    done = subprocess.run([str(S2T), "convert", str(tmp_path / "lgamma"), str(tmp_path / "out.onnx")],
                          capture_output=True, text=True, env=TF_QUIET, timeout=300)
    assert done.returncode != 0
    assert "op Lgamma at node PartitionedCall/Lgamma" in done.stderr
    assert "custom op" in done.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_opset_below_15_is_refused(built_artifacts, tmp_path):
    done = subprocess.run([str(S2T), "convert", str(built_artifacts["saved_model"]), str(tmp_path / "o.onnx"),
                           "--opset", "13"], capture_output=True, text=True, env=TF_QUIET, timeout=120)
    assert done.returncode != 0 and "opset 13 is below 15" in done.stderr
