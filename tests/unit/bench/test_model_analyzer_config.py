import json
import os

import yaml

from s2t.bench.load import model_analyzer
from s2t.serve.triton_server import TRITON_DIR


def test_model_analyzer_is_pointed_at_the_embedded_server_and_the_pipeline_with_its_scorer(built_artifacts,
                                                                                           model_repository, tmp_path):
    config = yaml.safe_load(model_analyzer.prepare(tmp_path, model_repository, built_artifacts["data"]).read_text())
    assert config["triton_launch_mode"] == "local"
    assert config["triton_server_path"] == str(TRITON_DIR / "bin" / "tritonserver")
    backends = tmp_path / "backends"
    assert config["triton_server_flags"]["backend_directory"] == str(backends)
    assert (backends / "python" / "triton_python_backend_stub").is_file() and (backends / "onnxruntime" / "model.py").is_file()
    assert "nvidia_pytriton.libs" in config["triton_server_environment"]["LD_LIBRARY_PATH"]
    assert list(config["profile_models"]) == ["risk_pipeline"] and config["profile_models"]["risk_pipeline"]["cpu_only"]
    # risk_pipeline loads its scorer's file from its own repository: the scorer travels with it.
    repository = tmp_path / "repository"
    assert sorted(p.name for p in repository.iterdir()) == ["risk_pipeline", "risk_scorer"]
    assert list((repository / "risk_scorer").glob("[0-9]*/model.onnx"))
    records = json.loads((tmp_path / "records.json").read_text())["data"]
    assert len(records) == model_analyzer.RECORDS and "features" in json.loads(records[0]["payload"]["content"][0])
    wrapper = tmp_path / "perf_analyzer.sh"
    assert os.access(wrapper, os.X_OK) and "cuda_runtime" in wrapper.read_text()
    assert (config["run_config_search_min_concurrency"], config["run_config_search_max_concurrency"]) == (16, 16)
