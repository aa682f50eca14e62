import numpy as np
import onnxruntime as ort

from s2t.backends.records.record_decoder import encode_columns
from s2t.bench.scenarios.crossover import heavier


def test_a_heavier_scorer_costs_more_and_answers_exactly_as_the_real_one(built_artifacts, tmp_path, german_credit_data,
                                                                        feature_spec):
    categorical, numeric = encode_columns(feature_spec, german_credit_data.columns)
    feed = {"categorical": categorical, "numeric": numeric}
    real = ort.InferenceSession(str(built_artifacts["onnx"]), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    path = heavier(built_artifacts["onnx"], 256, 2, tmp_path / "heavy.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, feed)[0], real)
    assert path.stat().st_size > built_artifacts["onnx"].stat().st_size + 256 * 256 * 4
    # The feature spec travels with the graph: risk_pipeline can run the heavier file as any version.
    assert "skill2triton.feature_spec" in session.get_modelmeta().custom_metadata_map
