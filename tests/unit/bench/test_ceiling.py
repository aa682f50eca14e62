"""The ceiling model the benchmark adds to its copy of the repository: risk_pipeline's serving path, no work."""
import importlib.util
import shutil

import numpy as np

from s2t import triton_config
from s2t.bench.baselines import ceiling
from tests.conftest import MODEL_REPOSITORY


def test_the_ceiling_has_risk_pipelines_tensors_batching_and_backend_and_no_parameters(tmp_path):
    repo = _with_pipeline(tmp_path)
    folder = ceiling.add(repo)
    ours, pipeline = triton_config.load(folder), triton_config.load(repo / "risk_pipeline")
    assert ours.name == ceiling.CEILING == "risk_pipeline_ceiling" and not ours.parameters and pipeline.parameters
    for field in ("backend", "max_batch_size", "input", "output", "dynamic_batching", "instance_group"):
        assert getattr(ours, field) == getattr(pipeline, field), field


def test_the_ceiling_answers_every_record_without_reading_it(tmp_path):
    folder = ceiling.add(_with_pipeline(tmp_path))
    spec = importlib.util.spec_from_file_location("ceiling_model", folder / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.InProcessModel(None)
    rows = model.execute([b"{}", b"not even json", b""])
    assert rows.errors is None
    assert rows.outputs["probability"].shape == (3, 1) and rows.outputs["probability"].dtype == np.float32
    assert rows.outputs["decision"].shape == (3, 1) and rows.outputs["decision"].dtype == object
    assert set(rows.outputs["decision"].ravel()) == {b"APPROVE"}


def _with_pipeline(tmp_path):
    repo = tmp_path / "model_repository"
    (repo / "risk_pipeline").mkdir(parents=True)
    shutil.copy(MODEL_REPOSITORY / "risk_pipeline" / "config.pbtxt", repo / "risk_pipeline")
    return repo
