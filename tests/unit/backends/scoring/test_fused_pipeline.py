import json
import shutil

import numpy as np
import pytest

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.scoring.decision_policy import Thresholds, decide
from s2t.backends.scoring.fused_pipeline import FusedPipeline, PipelineSettings, scorer_path, warm_pipeline
from s2t.backends.runtime.repository_layout import live_switch_file
from s2t.backends.scoring.ort_runner import ModelConfigError
from s2t.backends.records.record_decoder import RecordDecoder

PARAMETERS = {"scorer_model": {"string_value": "risk_scorer"}, "scorer_version": {"string_value": ""},
              "review_threshold": {"string_value": "0.3"}, "decline_threshold": {"string_value": "0.6"},
              "intra_op_thread_count": {"string_value": "1"}}


def settings(**changes):
    return read_parameters(PipelineSettings, {**PARAMETERS, **{k: {"string_value": v} for k, v in changes.items()}}, ModelConfigError)


def test_settings_read_the_scorer_the_thresholds_and_the_engine_threads_from_parameters():
    read = settings(scorer_version="3", max_record_bytes="1024")
    assert (read.scorer_model, read.scorer_version, read.max_record_bytes) == ("risk_scorer", 3, 1024)
    assert read.thresholds == Thresholds(0.3, 0.6)
    assert read.ort.intra_op_thread_count == 1
    assert settings().scorer_version is None


@pytest.mark.parametrize("key, value, message", [
    ("scorer_model", "", "parameter scorer_model is required"),
    ("scorer_model", "../elsewhere", "scorer_model: must name a model folder"),
    ("scorer_version", "latest", "scorer_version: must be a version number or empty"),
    ("scorer_version", "0", "scorer_version: must be a version number or empty"),
    ("scorer_version", "-1", "scorer_version: must be a version number or empty"),
    ("max_record_bytes", "0", "max_record_bytes: must be a positive integer"),
    ("review_threshold", "0.9", "thresholds must satisfy"),
    ("decline_threshold", "high", "expected a number"),
])
def test_settings_refuse_a_config_that_cannot_work(key, value, message):
    with pytest.raises(ModelConfigError, match=message):
        settings(**{key: value})


@pytest.fixture
def repository(tmp_path, built_artifacts):
    for version in (1, 3):
        (tmp_path / "risk_scorer" / str(version)).mkdir(parents=True)
        shutil.copy(built_artifacts["onnx"], tmp_path / "risk_scorer" / str(version) / "model.onnx")
    (tmp_path / "risk_scorer" / "10_staging").mkdir()
    return tmp_path


def test_scorer_path_is_the_version_named_or_else_the_newest_version_folder(repository):
    assert scorer_path(repository, settings(scorer_version="1")) == repository / "risk_scorer" / "1" / "model.onnx"
    assert scorer_path(repository, settings()) == repository / "risk_scorer" / "3" / "model.onnx"


@pytest.mark.parametrize("changes, message", [
    ({"scorer_version": "2"}, r"scorer 'risk_scorer' version 2: .*/risk_scorer/2/model.onnx does not exist"),
    ({"scorer_model": "risk_scorer_v9"}, "scorer 'risk_scorer_v9' has no version folder"),
])
def test_a_missing_scorer_file_is_refused_naming_the_path(repository, changes, message):
    with pytest.raises(ModelConfigError, match=message):
        scorer_path(repository, settings(**changes))


def test_an_onnx_file_without_the_feature_spec_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Identity", ["numeric"], ["probability"])], "bare",
                              [helper.make_tensor_value_info("numeric", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]), str(tmp_path / "model.onnx"))
    with pytest.raises(ModelConfigError, match="no skill2triton.feature_spec metadata"):
        FusedPipeline(tmp_path / "model.onnx", settings())


@pytest.fixture(scope="module")
def pipeline(built_artifacts):
    return FusedPipeline(built_artifacts["onnx"], settings())


def test_the_batch_scores_as_decode_then_onnx_runtime_then_decide(pipeline, german_credit_data):
    import onnxruntime as ort
    payloads = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:64]]
    scored = pipeline.score(payloads)
    decoded = RecordDecoder(pipeline.spec).decode(payloads)
    session = ort.InferenceSession(str(pipeline.session._model_path), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"categorical": decoded.categorical, "numeric": decoded.numeric})
    assert scored.probability.shape == (64, 1) and scored.probability.dtype == np.float32
    np.testing.assert_array_equal(scored.probability, expected.reshape(64, 1))
    assert scored.decision.shape == (64, 1)
    assert scored.decision.ravel().tolist() == decide(expected, pipeline.thresholds).ravel().tolist()
    assert scored.errors == (None,) * 64


def test_each_bad_record_gets_its_own_error_and_its_batch_mates_their_scores(pipeline, german_credit_data):
    records = german_credit_data.records()[:3]
    good = [json.dumps({"features": r}).encode() for r in records]
    alone = pipeline.score(good)
    mixed = pipeline.score([good[0], b"{", good[1], json.dumps({"features": {}}).encode(), good[2]])
    assert [str(e) if e else None for e in mixed.errors] == [
        None, "payload: not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)",
        None, f"features.{pipeline.spec.categorical[0].name}: missing", None]
    np.testing.assert_array_equal(mixed.probability[[0, 2, 4]], alone.probability)
    assert mixed.decision[[0, 2, 4]].ravel().tolist() == alone.decision.ravel().tolist()


@pytest.fixture
def two_versions(tmp_path, built_artifacts):
    """risk_scorer 1 (the German Credit model) and 2 (the same scores + SHIFT), told apart by their answers."""
    from tests.samples import SHIFT, shifted_model
    repo = tmp_path / "model_repository"
    (repo / "risk_scorer" / "1").mkdir(parents=True)
    (repo / "risk_scorer" / "2").mkdir(parents=True)
    shutil.copy(built_artifacts["onnx"], repo / "risk_scorer" / "1" / "model.onnx")
    shifted_model(built_artifacts["onnx"], repo / "risk_scorer" / "2" / "model.onnx", SHIFT)
    return repo


def _switch(repo, text):
    from s2t.atomic_files import write_atomically
    write_atomically(live_switch_file(repo, "risk_pipeline"), text)


def test_the_live_switch_serves_the_warm_standby_from_the_next_batch(two_versions, german_credit_data):
    from tests.samples import SHIFT
    payloads = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:32]]
    warm = warm_pipeline(two_versions, settings(scorer_version="2", standby_scorer_version="1"), "risk_pipeline")
    shifted = warm.score(payloads).probability
    _switch(two_versions, json.dumps({"scorer_version": 1}))
    assert warm.serving() == 1
    back = warm.score(payloads).probability
    np.testing.assert_allclose(np.minimum(back + SHIFT, 1.0), shifted, atol=1e-5)
    for text in (json.dumps({"scorer_version": 7}), "not json", json.dumps({"scorer_version": 2})):
        _switch(two_versions, text)  # a version not warm here, or a file that cannot be read: the configured one
        assert warm.serving() == 2
        np.testing.assert_array_equal(warm.score(payloads).probability, shifted)
    live_switch_file(two_versions, "risk_pipeline").unlink()
    assert warm.serving() == 2


@pytest.mark.parametrize("configured, standby, warm_versions, serving", [
    ("2", "1", [2, 1], 2),
    ("2", "", [2], 2),
    ("2", "9", [2], 2),  # the standby's folder was retired since: not kept warm
    ("9", "1", [1], 1),  # a config the live server still runs names a retired version: the standby serves
    ("", "", [2], 2),  # no version named: the newest folder, as before
])
def test_a_warm_pipeline_keeps_the_versions_whose_folders_are_there(two_versions, configured, standby,
                                                                    warm_versions, serving):
    warm = warm_pipeline(two_versions, settings(scorer_version=configured, standby_scorer_version=standby),
                         "risk_pipeline")
    assert list(warm.pipelines) == warm_versions and warm.serving() == serving


def test_a_warm_pipeline_without_any_named_folder_is_refused_naming_the_path(two_versions):
    for version in (1, 2):
        shutil.rmtree(two_versions / "risk_scorer" / str(version))
    with pytest.raises(ModelConfigError, match=r"version 2: .*/risk_scorer/2/model.onnx does not exist"):
        warm_pipeline(two_versions, settings(scorer_version="2", standby_scorer_version="1"), "risk_pipeline")
