"""model_repository_gpu on a machine without a GPU: its configs, the engine checks publish and check-config make
without TensorRT, the router's reach into it, and FP16 parity measured by emulation. tests/gpu does the rest on a GPU.
"""
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DATA_CSV, GPU_REPOSITORY, MODEL_REPOSITORY, ROOT, S2T, SAVED_MODEL, SCORER_ONNX, has_gpu
from s2t.backends.runtime.repository_layout import version_numbers
from s2t import triton_config
from s2t.gate import model_config
from s2t.models import tensorrt_engine
from s2t.control.split_config import CanaryError
from s2t.control.rollout import Rollout, canary
from tritonclient.grpc import model_config_pb2 as mc
from s2t.control.publish import ParityGate, PublishError, publish


GPU_MODELS = ("risk_scorer_trt", "risk_scorer_cuda")


def test_the_gpu_scorers_take_and_give_exactly_what_risk_scorer_does():
    scorer = triton_config.load(MODEL_REPOSITORY / "risk_scorer")
    for name in GPU_MODELS:
        config = triton_config.load(GPU_REPOSITORY / name)
        assert config.name == name
        assert triton_config.tensors(config.input) == triton_config.tensors(scorer.input), name
        assert triton_config.tensors(config.output) == triton_config.tensors(scorer.output), name
        assert config.max_batch_size == scorer.max_batch_size, name
        assert [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.KIND_GPU], f"{name}: not KIND_GPU"


def test_the_engine_config_asks_for_cuda_graphs_at_its_preferred_batch_sizes():
    config = triton_config.load(GPU_REPOSITORY / "risk_scorer_trt")
    assert config.platform == "tensorrt_plan"
    assert config.optimization.cuda.graphs
    graph_batches = {spec.batch_size for spec in config.optimization.cuda.graph_spec}
    assert set(config.dynamic_batching.preferred_batch_size) <= graph_batches
    assert max(graph_batches) <= config.max_batch_size


def test_check_config_says_only_that_the_gpu_versions_are_still_to_be_built():
    problems = model_config.check_repositories([GPU_REPOSITORY])
    assert sorted(problems) == sorted([
        "risk_scorer_cuda: no version folder",
        "risk_scorer_trt: no version folder (engines are built on the serving GPU: `s2t build-trt`, then "
        "`s2t publish`)"])


def _engine(tmp_path: Path, *, shapes=None, maximum=256, precision="fp32", onnx_path=SCORER_ONNX,
            tensorrt=tensorrt_engine.TENSORRT_VERSION) -> Path:
    """An engine file as build-trt leaves it: the plan and its build report. The plan's bytes are not TensorRT's
    (that needs a GPU); everything checked here reads the report, and the parity gate, which would run the
    plan, must refuse without a GPU."""
    plan = tmp_path / f"risk_scorer.{precision}.plan"
    plan.write_bytes(b"not built here")
    shapes = shapes or {"categorical": [[1, 13], [64, 13], [maximum, 13]], "numeric": [[1, 7], [64, 7], [maximum, 7]]}
    tensorrt_engine.report_path(plan).write_text(json.dumps({
        "onnx": str(onnx_path), "onnx_sha256": hashlib.sha256(Path(onnx_path).read_bytes()).hexdigest(),
        "tensorrt": tensorrt, "gpu": "NVIDIA H200 (sm_90)", "precision": precision,
        "profile": {"minimum": 1, "optimum": 64, "maximum": maximum}, "shapes": shapes}))
    return plan


@pytest.fixture
def gpu_repository(tmp_path):
    dest = tmp_path / "model_repository_gpu"
    shutil.copytree(GPU_REPOSITORY, dest)
    return dest


def test_publish_refuses_an_engine_without_a_build_report(gpu_repository, tmp_path, built_artifacts):
    plan = tmp_path / "bare.plan"
    plan.write_bytes(b"engine")
    with pytest.raises(PublishError, match="no build report"):
        publish("risk_scorer_trt", plan, gpu_repository, None)
    assert version_numbers(gpu_repository / "risk_scorer_trt") == []


@pytest.mark.parametrize("kwargs, reason", [
    ({"maximum": 64}, "exceeds the engine's profile"),
    ({"shapes": {"categorical": [[1, 12], [64, 12], [256, 12]], "numeric": [[1, 7], [64, 7], [256, 7]]}},
     "input 'categorical' is declared \\[13\\]"),
])
def test_publish_refuses_an_engine_built_for_other_shapes(gpu_repository, tmp_path, built_artifacts, kwargs, reason):
    with pytest.raises(PublishError, match=reason):
        publish("risk_scorer_trt", _engine(tmp_path, **kwargs), gpu_repository, None)
    assert version_numbers(gpu_repository / "risk_scorer_trt") == []


# 24.10's TensorRT (what `make gpu-models` built before the image moved to 25.08), and a lookalike of the pinned one.
@pytest.mark.parametrize("built_with", ["10.5.0.18", tensorrt_engine.TENSORRT_VERSION + "0"])
def test_an_engine_of_another_tensorrt_is_refused_by_publish_and_flagged_by_check_config(
        gpu_repository, tmp_path, built_artifacts, built_with):
    reason = f"built with TensorRT {built_with}, but .*{tensorrt_engine.TENSORRT_VERSION}"
    with pytest.raises(PublishError, match=reason):
        publish("risk_scorer_trt", _engine(tmp_path, tensorrt=built_with), gpu_repository, None)
    assert version_numbers(gpu_repository / "risk_scorer_trt") == []
    # One already in the repository (published before the image moved): check-config names it.
    version = publish("risk_scorer_trt", _engine(tmp_path), gpu_repository, None)
    report = gpu_repository / "risk_scorer_trt" / str(version) / "model.plan.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "tensorrt": built_with}))
    problems = [p for p in model_config.check_repositories([gpu_repository]) if p.startswith("risk_scorer_trt")]
    assert len(problems) == 1 and f"built with TensorRT {built_with}" in problems[0], problems


def test_publish_refuses_an_engine_whose_onnx_source_changed(gpu_repository, tmp_path, built_artifacts):
    source = tmp_path / "source.onnx"
    shutil.copyfile(SCORER_ONNX, source)
    plan = _engine(tmp_path, onnx_path=source)
    source.write_bytes(source.read_bytes() + b"\0")
    with pytest.raises(PublishError, match="has changed since"):
        publish("risk_scorer_trt", plan, gpu_repository, None)


@pytest.mark.skipif(has_gpu(), reason="a GPU is here: tests/gpu gates real engines")
def test_the_engine_parity_gate_refuses_without_the_gpu_and_nothing_is_published(gpu_repository, tmp_path,
                                                                                 built_artifacts):
    with pytest.raises(PublishError, match="parity gate needs the engine's GPU"):
        publish("risk_scorer_trt", _engine(tmp_path), gpu_repository, ParityGate(SAVED_MODEL, DATA_CSV))
    assert version_numbers(gpu_repository / "risk_scorer_trt") == []


def test_a_published_engine_keeps_its_build_report_where_check_config_reads_it(gpu_repository, tmp_path,
                                                                                built_artifacts):
    # No parity gate: this checks the layout a gated publish leaves (the gate itself runs in tests/gpu).
    version = publish("risk_scorer_trt", _engine(tmp_path), gpu_repository, None)
    folder = gpu_repository / "risk_scorer_trt" / str(version)
    assert (folder / "model.plan").read_bytes() == b"not built here"
    assert json.loads((folder / "model.plan.json").read_text())["tensorrt"] == tensorrt_engine.TENSORRT_VERSION
    assert [p for p in model_config.check_repositories([gpu_repository]) if p.startswith("risk_scorer_trt")] == []
    (folder / "model.plan.json").unlink()
    assert any("no build report" in p for p in model_config.check_repositories([gpu_repository]))


def test_the_router_can_take_a_gpu_scorer_as_canary_from_the_gpu_repository(gpu_repository, tmp_path,
                                                                           built_artifacts):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__", "[0-9]*"))
    shutil.copytree(MODEL_REPOSITORY / "risk_router" / "1", repository / "risk_router" / "1")
    with pytest.raises(CanaryError, match="risk_scorer_trt has no version 1 in .*model_repository_gpu"):
        canary(Rollout("risk_scorer_trt", repository), 1, 10.0, 0.0, candidate_repositories=(gpu_repository,))
    publish("risk_scorer_trt", _engine(tmp_path), gpu_repository, None)
    settings = canary(Rollout("risk_scorer_trt", repository), 1, 10.0, 0.0, candidate_repositories=(gpu_repository,))
    assert str(settings.candidate) == "risk_scorer_trt:1" and settings.canary_percent == 10.0
    text = (repository / "risk_router" / "config.pbtxt").read_text()
    assert 'key: "candidate" value: { string_value: "risk_scorer_trt:1" }' in text


def test_parity_measures_fp16_by_emulation_and_compares_every_decision(built_artifacts, tmp_path):
    report = tmp_path / "parity.json"
    proc = subprocess.run([str(S2T), "parity", "--saved-model", str(SAVED_MODEL), "--onnx", str(SCORER_ONNX),
                           "--data", str(DATA_CSV), "--fp16-emulation", "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(report.read_text())
    fp32, fp16 = result["comparisons"]
    assert fp32["atol"] == 1e-5 and fp16["atol"] == 1e-3
    # Really computed in float16: far from the FP32 graph's 1e-7, well inside the FP16 tolerance.
    assert 1e-6 < fp16["max_abs"] < 1e-3 and fp32["max_abs"] < 1e-6
    assert fp32["decisions_changed"] == []
    # A decision can only change on a row within the FP16 tolerance of a threshold, and the table says so.
    assert set(fp16["decisions_changed"]) <= set(result["near_threshold"])
    assert ("decision changed" in proc.stdout) == bool(fp16["decisions_changed"])
    assert result["near_band"] == 1e-3
    assert (f"{len(result['near_threshold'])} rows lie within 0.001" in proc.stdout) == bool(result["near_threshold"])
