"""The benchmark's copies of model repositories and its one way to edit a copy's config.pbtxt."""
from s2t import triton_config
from s2t.bench.harness import repository
from s2t.bench.harness.modes import MODES
from s2t.bench.harness.runner import baseline_sides
from tests.conftest import MODEL_REPOSITORY


def test_a_copy_holds_the_models_asked_for_without_bytecode(tmp_path):
    copy = repository.copy_repository(MODEL_REPOSITORY, tmp_path / "copy", ("risk_pipeline", "risk_scorer"))
    assert sorted(p.name for p in copy.iterdir()) == ["risk_pipeline", "risk_scorer"]
    assert not list(copy.rglob("__pycache__"))
    copies = repository.copy_repositories([MODEL_REPOSITORY, MODEL_REPOSITORY], tmp_path / "all")
    assert len({c.name for c in copies}) == 2 and all((c / "risk_pipeline" / "config.pbtxt").is_file() for c in copies)


def test_a_config_is_edited_through_its_protobuf_and_only_where_asked(tmp_path):
    copy = repository.copy_repository(MODEL_REPOSITORY, tmp_path / "copy", ("risk_pipeline",))
    before = triton_config.load(copy / "risk_pipeline")

    def change(config):
        config.parameters["scorer_version"].string_value = "7"

    repository.edit_config(copy / "risk_pipeline", change)
    after = triton_config.load(copy / "risk_pipeline")
    assert after.parameters["scorer_version"].string_value == "7"
    after.parameters["scorer_version"].string_value = before.parameters["scorer_version"].string_value
    assert after == before


def test_the_full_mode_sweeps_the_fastapi_workers_and_smoke_keeps_one_side_per_app():
    assert set(baseline_sides(MODES["smoke"])) == {"baseline", "fastapi-docs"}
    full = baseline_sides(MODES["full"])
    assert full["baseline (1 worker)"] == ("baseline", 1) and full["fastapi-docs (4 workers)"] == ("fastapi-docs", 4)
    assert len(full) == 6
