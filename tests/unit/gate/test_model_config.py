import shutil
from pathlib import Path

import pytest

from s2t.gate.model_config import check_repositories

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def repositories(tmp_path):
    """Copies of the committed configs and python models (no ONNX versions: they are built, not committed)."""
    copies = []
    for name in ("model_repository", "ensembles"):
        dest = tmp_path / name
        shutil.copytree(ROOT / name, dest, ignore=shutil.ignore_patterns("model.onnx", "feature_spec.json",
                                                                          "publish.json", "__pycache__"))
        copies.append(dest)
    for version in [*(copies[0] / "risk_scorer").glob("[0-9]*"), *(copies[0] / "risk_scorer_lite").glob("[0-9]*")]:
        shutil.rmtree(version)
    return copies


def test_committed_configs_are_consistent_apart_from_the_unbuilt_scorers(repositories):
    assert sorted(check_repositories(repositories)) == ["risk_pipeline: scorer_version 1 of risk_scorer has no model.onnx",
                                                        "risk_scorer: no version folder",
                                                        "risk_scorer_lite: no version folder"]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old, new, problem", [
    ('input_map { key: "probability" value: "probability" }', 'input_map { key: "probability" value: "score" }',
     "risk_pipeline_ensemble step 2 (risk_decision): 'score' is not produced before this step"),
    ('output_map { key: "decision" value: "decision" }', 'output_map { key: "verdict" value: "decision" }',
     "risk_pipeline_ensemble step 2 (risk_decision): output_map names 'verdict', not an output of risk_decision"),
    ('model_name: "risk_decision"', 'model_name: "risk_decider"',
     "risk_pipeline_ensemble step 2 (risk_decider): no model 'risk_decider' in the repositories"),
])
def test_broken_ensemble_wiring_is_reported_with_the_step(repositories, old, new, problem):
    edit(repositories[1] / "risk_pipeline_ensemble" / "config.pbtxt", old, new)
    assert problem in check_repositories(repositories)


def test_dtype_mismatch_between_steps_is_reported(repositories):
    edit(repositories[0] / "skill_adapter" / "config.pbtxt", "data_type: TYPE_FP32", "data_type: TYPE_FP64")
    problems = check_repositories(repositories)
    assert any("'numeric' is TYPE_FP64[7], risk_scorer.numeric wants TYPE_FP32[7]" in p for p in problems)


def test_config_name_must_match_its_folder(repositories):
    edit(repositories[0] / "risk_decision" / "config.pbtxt", 'name: "risk_decision"', 'name: "decision"')
    assert any("config name 'decision' differs from the folder name" in p for p in check_repositories(repositories))


def test_the_fused_pipeline_must_name_an_onnx_scorer_of_its_repository(repositories):
    edit(repositories[0] / "risk_pipeline" / "config.pbtxt", 'string_value: "risk_scorer" }', 'string_value: "risk_router" }')
    assert "risk_pipeline: scorer_model 'risk_router' is not an ONNX model" in check_repositories(repositories)


def test_a_scorer_version_that_does_not_exist_is_reported(repositories):
    config = repositories[0] / "risk_pipeline" / "config.pbtxt"
    edit(config, 'key: "scorer_version"\n  value: { string_value: "1" }', 'key: "scorer_version"\n  value: { string_value: "7" }')
    assert "risk_pipeline: scorer_version 7 of risk_scorer has no model.onnx" in check_repositories(repositories)


def test_decision_thresholds_must_agree_between_the_models_that_decide(repositories):
    edit(repositories[0] / "risk_decision" / "config.pbtxt", 'string_value: "0.6"', 'string_value: "0.7"')
    assert ("the decision thresholds differ between models: risk_decision review 0.3 decline 0.7, "
            "risk_pipeline review 0.3 decline 0.6") in check_repositories(repositories)


@pytest.mark.parametrize("model, old, new, problem", [
    ("risk_router", '"breaker_open_seconds"', '"breaker_open_secs"',
     "risk_router: parameter breaker_open_secs is not one the model reads"),
    ("risk_router", 'string_value: "0.1" } }', 'string_value: "a tenth" } }',
     "risk_router: parameter breaker_max_error_rate: expected a number, got 'a tenth'"),
    ("risk_stream", 'string_value: "200"', 'string_value: "-5"', "risk_stream: reorder_timeout_ms must be positive, got -5.0"),
    ("risk_stream", '"max_streams"\n  value: { string_value: "4096" }', '"max_streams"\n  value: { string_value: "1000" }',
     "risk_stream: max_streams (1000) must be at least sequence_batching's max_candidate_sequences (4096): every "
     "stream Triton holds a slot for keeps its state"),
    ("risk_pipeline", '"max_record_bytes"\n  value: { string_value: "65536" }',
     '"max_record_bytes"\n  value: { string_value: "64k" }',
     "risk_pipeline: parameter max_record_bytes: expected an integer, got '64k'"),
])
def test_parameters_a_model_does_not_read_or_cannot_parse_are_reported(repositories, model, old, new, problem):
    edit(repositories[0] / model / "config.pbtxt", old, new)
    assert problem in check_repositories(repositories)


def test_the_language_model_configs_read_every_parameter_they_set():
    assert check_repositories([ROOT / "model_repository_llm"]) == []


def test_a_python_model_is_checked_with_the_settings_its_model_py_declares_whatever_its_name(repositories):
    """check-config reads a model's settings from its model.py, so a model copied under a new name is checked too."""
    renamed = repositories[0] / "risk_decision_eu"
    (repositories[0] / "risk_decision").rename(renamed)
    edit(renamed / "config.pbtxt", 'name: "risk_decision"', 'name: "risk_decision_eu"')
    edit(renamed / "config.pbtxt", '"review_threshold"', '"review_treshold"')
    assert "risk_decision_eu: parameter review_treshold is not one the model reads" in check_repositories(repositories)


def test_a_language_model_config_with_a_typo_is_reported(tmp_path):
    copy = tmp_path / "model_repository_llm"
    shutil.copytree(ROOT / "model_repository_llm", copy, ignore=shutil.ignore_patterns("*.gguf", "__pycache__"))
    edit(copy / "llm" / "config.pbtxt", 'key: "threads"', 'key: "thread"')
    assert "llm: parameter thread is not one the model reads" in check_repositories([copy])


@pytest.mark.parametrize("model, old, new, problem", [
    ("llm", 'string_value: "length_aware"', 'string_value: "shortest"',
     "llm: batching_policy must be one of length_aware, fifo, got 'shortest'"),
    ("llm", 'key: "slots"\n  value: { string_value: "8" }', 'key: "slots"\n  value: { string_value: "0" }',
     "llm: engine parameters out of range: threads 1 (>= 1), slots 0 (>= 1), context_per_slot 1536 (>= 64)"),
    ("llm", 'key: "default_max_tokens"\n  value: { string_value: "64" }',
     'key: "default_max_tokens"\n  value: { string_value: "lots" }',
     "llm: parameter default_max_tokens: expected an integer, got 'lots'"),
    ("risk_explainer", 'key: "workers"\n  value: { string_value: "4" }', 'key: "workers"\n  value: { string_value: "0" }',
     "risk_explainer: parameter workers: must be a positive integer, got '0'"),
])
def test_a_bad_language_model_parameter_is_refused_naming_it(tmp_path, model, old, new, problem):
    """check-config reads each language model's settings as its model.py declares them, before any server starts."""
    copy = tmp_path / "model_repository_llm"
    shutil.copytree(ROOT / "model_repository_llm", copy, ignore=shutil.ignore_patterns("*.gguf", "__pycache__"))
    edit(copy / model / "config.pbtxt", old, new)
    assert check_repositories([copy]) == [problem]
