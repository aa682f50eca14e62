"""Issue 7 on a GPU: engines built with the serving image's TensorRT, parity against the legacy model (FP32 1e-5,
FP16 at the documented tolerance, decisions compared on all 1000 rows), publish through the gate, the benchmark.

Run with `make test-gpu` (or tests/gpu/run.sh on a GPU machine); elsewhere every test here is skipped.
"""
import json
import shutil

import numpy as np
import pytest

from tests.conftest import DATA_CSV, ROOT, SAVED_MODEL, SCORER_ONNX
from s2t.gate import model_config, parity
from s2t.models import dataset, serving_image, tensorrt_engine
from s2t.control.publish import ParityGate, publish
from s2t.models.tensorrt_engine import BatchProfile

pytestmark = pytest.mark.gpu  # tests/gpu/conftest.py skips them, naming what is missing, where they cannot run
PROFILE = BatchProfile(1, 64, 256)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, built_artifacts):
    out = tmp_path_factory.mktemp("engines")
    cache = out / "timing.cache"
    built = {}
    for precision in ("fp32", "fp16"):
        built[precision] = out / f"risk_scorer.{precision}.plan"
        report = tensorrt_engine.build_engine(SCORER_ONNX, built[precision], precision, PROFILE, cache)
        assert serving_image.same_release(report["tensorrt"], tensorrt_engine.TENSORRT_VERSION)
        assert report["precision"] == precision and built[precision].stat().st_size > 0
    assert cache.stat().st_size > 0, "the timing cache was not written"
    return built


def _engine_comparison(engine, thresholds):
    report = parity.run(SAVED_MODEL, SCORER_ONNX, DATA_CSV, thresholds=thresholds, engines=(engine,), localise=False)
    print(report.table())
    return report, report.comparisons[-1]


def test_fp32_engine_matches_the_legacy_model_within_1e_5_and_no_decision_changes(engines, decision_thresholds):
    report, engine = _engine_comparison(engines["fp32"], decision_thresholds)
    assert engine.atol == 1e-5 and engine.rows == 1000
    assert engine.passed, report.table()
    assert engine.decisions_changed == [], report.table()


def test_fp16_engine_is_within_the_documented_tolerance_and_lists_any_changed_decision(engines, decision_thresholds):
    report, engine = _engine_comparison(engines["fp16"], decision_thresholds)
    assert engine.atol == parity.FP16_ATOL
    assert engine.passed, report.table()
    # Only rows within the FP16 band of a threshold may change; parity lists them.
    assert set(engine.decisions_changed) <= set(report.near_threshold), report.table()


@pytest.mark.parametrize("rows", [1, 63, 256, 1000])
def test_every_batch_size_of_the_profile_gives_the_same_scores(engines, rows):
    data = dataset.load(DATA_CSV)
    categorical, numeric = parity.packed_inputs(SCORER_ONNX, data.columns)
    full = tensorrt_engine.engine_scores(engines["fp32"], categorical, numeric)
    part = tensorrt_engine.engine_scores(engines["fp32"], categorical[:rows], numeric[:rows])
    np.testing.assert_allclose(part, full[:rows], atol=1e-6)


def test_onnxruntime_cuda_ep_matches_the_legacy_model(built_artifacts):
    import onnxruntime as ort
    data = dataset.load(DATA_CSV)
    categorical, numeric = parity.packed_inputs(SCORER_ONNX, data.columns)
    session = ort.InferenceSession(str(SCORER_ONNX), providers=["CUDAExecutionProvider"])
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    scores = session.run(None, {"categorical": categorical, "numeric": numeric})[0]
    reference = parity.reference_scores(SAVED_MODEL, DATA_CSV, data)
    assert parity.compare("onnxruntime CUDA EP", reference, scores, 1e-5).passed


def test_publish_gates_the_engine_and_check_config_accepts_the_version(engines, tmp_path):
    repository = tmp_path / "model_repository_gpu"
    shutil.copytree(ROOT / "model_repository_gpu", repository, ignore=shutil.ignore_patterns("[0-9]*"))
    version = publish("risk_scorer_trt", engines["fp32"], repository, ParityGate(SAVED_MODEL, DATA_CSV))
    record = json.loads((repository / "risk_scorer_trt" / str(version) / "publish.json").read_text())
    assert record["parity"]["rows"] == 1000 and record["parity"]["max_abs"] <= 1e-5
    assert not [p for p in model_config.check_repositories([repository]) if p.startswith("risk_scorer_trt")]


def test_the_gpu_benchmark_sweeps_engines_graphs_and_the_cpu(tmp_path, built_artifacts):
    from s2t.bench.scenarios import gpu
    results = gpu.run(SCORER_ONNX, DATA_CSV, tmp_path, seconds=0.3, batches=(1, 64), optima=(64,))
    measured = {(p["engine"].split(" opt")[0], p["cuda_graph"]) for p in results["points"]}
    refused = {(u["engine"].split(" opt")[0], u["cuda_graph"]) for u in results["unavailable"]}
    # A graph variant is either measured or reported with the reason it could not run.
    assert {("tensorrt fp32", False), ("tensorrt fp16", False), ("onnxruntime CUDA EP", False),
            ("onnxruntime CPU (1 thread)", False)} <= measured
    assert {("tensorrt fp32", True), ("tensorrt fp16", True), ("onnxruntime CUDA EP", True)} <= measured | refused
    assert all(p["rows_per_s"] > 0 for p in results["points"])
    assert (tmp_path / "results.md").read_text().startswith("# GPU benchmark")
    # Each group of points watched for the machine's load; the verdict under the heading.
    labels = [r["label"] for r in results["load"]["rounds"]]
    assert labels == ["tensorrt fp32 opt 64", "tensorrt fp16 opt 64", "onnxruntime CUDA EP", "onnxruntime CPU"]
    assert results["publishable"] is results["load"]["publishable"]
    assert ("**Publishable**" in (tmp_path / "results.md").read_text()) is results["publishable"]
