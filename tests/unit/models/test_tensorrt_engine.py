"""The CPU side of `s2t build-trt`: what may go to TensorRT, the batch profile, and clear refusals without a GPU."""
import json
import re
import subprocess
import sys
import types

import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import GPU_REPOSITORY, ROOT, S2T, has_gpu
from s2t.models import serving_image, tensorrt_engine
from s2t.models.tensorrt_engine import BatchProfile, EngineBuildError



def string_lookup_graph() -> onnx.ModelProto:
    """What tf2onnx makes of a legacy vocabulary lookup: a string input through ai.onnx.ml's CategoryMapper."""
    mapper = helper.make_node("CategoryMapper", ["purpose"], ["purpose_index"], name="purpose_lookup",
                              domain="ai.onnx.ml", cats_strings=["car", "radio"], cats_int64s=[1, 2], default_int64=0)
    cast = helper.make_node("Cast", ["purpose_index"], ["score"], name="to_float", to=TensorProto.FLOAT)
    graph = helper.make_graph([mapper, cast], "raw_tf2onnx",
                              [helper.make_tensor_value_info("purpose", TensorProto.STRING, ["batch", 1])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), helper.make_opsetid("ai.onnx.ml", 2)])


def test_a_graph_with_string_lookups_is_refused_naming_the_node_and_the_input():
    blockers = tensorrt_engine.tensorrt_blockers(string_lookup_graph())
    assert {(b.node, b.op) for b in blockers} == {("purpose", "graph input/output"),
                                                  ("purpose_lookup", "CategoryMapper")}


def test_build_refuses_a_string_graph_before_touching_tensorrt_and_says_how_to_split_it(tmp_path):
    model = tmp_path / "raw.onnx"
    onnx.save(string_lookup_graph(), str(model))
    with pytest.raises(EngineBuildError, match="(?s)purpose_lookup \\(CategoryMapper\\).*s2t convert"):
        tensorrt_engine.build_engine(model, tmp_path / "raw.plan", "fp32", BatchProfile(1, 8, 8))
    assert not (tmp_path / "raw.plan").exists()


def test_profile_shapes_put_the_batch_range_on_every_input_and_keep_the_feature_dims(built_artifacts):
    shapes = tensorrt_engine.profile_shapes(onnx.load(str(built_artifacts["onnx"])), BatchProfile(1, 64, 256))
    assert shapes == {"categorical": ((1, 13), (64, 13), (256, 13)), "numeric": ((1, 7), (64, 7), (256, 7))}


def test_a_fixed_batch_dimension_cannot_take_a_profile():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "fixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    with pytest.raises(EngineBuildError, match="fixed batch dimension"):
        tensorrt_engine.profile_shapes(helper.make_model(graph), BatchProfile(1, 2, 4))


@pytest.mark.parametrize("low, opt, high", [(0, 1, 1), (2, 1, 4), (1, 8, 4)])
def test_a_profile_must_be_ordered_from_one(low, opt, high):
    with pytest.raises(ValueError, match="1 <= min <= opt <= max"):
        BatchProfile(low, opt, high)


def test_the_profile_follows_the_served_config_max_batch_and_largest_preferred_batch():
    assert tensorrt_engine.profile_for_config(GPU_REPOSITORY / "risk_scorer_trt") == BatchProfile(1, 256, 256)
    assert tensorrt_engine.profile_for_config(GPU_REPOSITORY / "risk_scorer_trt", opt_batch=64) == \
        BatchProfile(1, 64, 256)
    with pytest.raises(EngineBuildError, match="--max-batch-size"):
        tensorrt_engine.profile_for_config(None)
    assert tensorrt_engine.profile_for_config(None, max_batch=32) == BatchProfile(1, 32, 32)


def test_engines_are_built_with_the_tensorrt_of_the_image_compose_serves():
    # Compose builds its Triton services from deploy/triton's Dockerfile, whose image starts from the NGC one.
    assert "dockerfile: deploy/triton/Dockerfile" in (ROOT / "docker-compose.yml").read_text()
    assert f"FROM {tensorrt_engine.SERVING_IMAGE} AS serving" in (ROOT / "deploy" / "triton" / "Dockerfile").read_text()
    release = serving_image.release_of(tensorrt_engine.SERVING_IMAGE)
    assert tensorrt_engine.TENSORRT_VERSION == release.tensorrt
    assert tensorrt_engine.ONNXRUNTIME_GPU_VERSION == release.onnxruntime


@pytest.mark.parametrize("tag", sorted(serving_image.RELEASES))
def test_each_image_gets_its_own_tensorrt_for_its_cuda_and_its_onnx_runtime_release_all_pinned(tag):
    release = serving_image.RELEASES[tag]
    assert f"tensorrt-cu{release.cuda_major}=={release.tensorrt}" in release.gpu_wheels
    assert f"onnxruntime-gpu=={release.onnxruntime}" in release.gpu_wheels
    assert not [w for w in release.gpu_wheels if w.startswith("tensorrt") and not w.endswith(f"=={release.tensorrt}")]
    for wheel in release.gpu_wheels:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9.]*(\.post[0-9]+)?", wheel), f"{wheel}: not pinned"


def test_make_gpu_venv_installs_what_the_serving_image_module_prints_and_rebuilds_when_it_changes():
    printed = subprocess.run([sys.executable, "-m", "s2t.models.serving_image"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()
    assert printed == list(serving_image.release_of(serving_image.SERVING_IMAGE).gpu_wheels)
    makefile = (ROOT / "Makefile").read_text()
    assert "-m s2t.models.serving_image)" in makefile
    assert "$(GPU_VENV)/.installed: $(GPU_WHEELS)" in makefile and "GPU_WHEELS := s2t/models/serving_image.py" in makefile
    assert "==" not in makefile.split("# ---- The GPU path", 1)[1].split("gpu-venv:", 1)[0], \
        "a GPU pin is written in the Makefile as well as in s2t/models/serving_image.py"


def test_the_tensorrt_doc_names_the_image_and_the_versions_it_pins():
    doc = (ROOT / "docs" / "tensorrt.md").read_text()
    release = serving_image.release_of(serving_image.SERVING_IMAGE)
    for fact in (serving_image.SERVING_IMAGE, release.tensorrt, release.onnxruntime, release.cuda, release.triton,
                 *release.gpu_wheels):
        assert fact in doc, f"docs/tensorrt.md does not mention {fact}"


def test_an_image_without_known_components_is_refused_naming_its_release():
    with pytest.raises(serving_image.UnknownImageError, match="'99.01'.*release notes"):
        serving_image.release_of("nvcr.io/nvidia/tritonserver:99.01-py3")
    assert serving_image.image_tag("nvcr.io/nvidia/tritonserver:25.08-py3") == "25.08"


@pytest.mark.parametrize("installed, pinned, same", [
    ("10.13.2.6", "10.13.2.6", True),
    ("10.13.2.6.post1", "10.13.2.6", True),
    ("10.13.2.60", "10.13.2.6", False),
    ("10.13.2", "10.13.2.6", False),
    ("10.13.3.9", "10.13.2.6", False),
    ("10.5.0.18", "10.5.0", True),
    ("10.5.01", "10.5.0", False),
])
def test_the_tensorrt_version_gate_compares_components_not_text(installed, pinned, same):
    assert serving_image.same_release(installed, pinned) is same


def test_a_tensorrt_whose_version_only_starts_like_the_pinned_one_is_refused(monkeypatch):
    # TensorRT cannot be installed here (no GPU; its wheels come from pypi.nvidia.com): a module with only the
    # version attribute stands in for it, which is all the gate reads.
    lookalike = tensorrt_engine.TENSORRT_VERSION + "0"
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__=lookalike))
    with pytest.raises(EngineBuildError, match=f"TensorRT {re.escape(lookalike)} is installed.*"
                                               f"{re.escape(tensorrt_engine.TENSORRT_VERSION)}"):
        tensorrt_engine.import_tensorrt()
    exact = types.SimpleNamespace(__version__=tensorrt_engine.TENSORRT_VERSION)
    monkeypatch.setitem(sys.modules, "tensorrt", exact)
    assert tensorrt_engine.import_tensorrt() is exact


@pytest.mark.skipif(has_gpu(), reason="a GPU is here: tests/gpu builds real engines")
def test_build_trt_without_a_gpu_fails_clearly_and_writes_nothing(built_artifacts, tmp_path):
    out = tmp_path / "risk_scorer.plan"
    proc = subprocess.run([str(S2T), "build-trt", str(built_artifacts["onnx"]), "--out", str(out), "--config",
                           str(GPU_REPOSITORY / "risk_scorer_trt"), "--timing-cache", str(tmp_path / "t.cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_engine_precision_and_batch_limit_come_from_the_build_report(tmp_path):
    plan = tmp_path / "x.plan"
    plan.write_bytes(b"engine")
    assert tensorrt_engine.engine_precision(plan) == "fp16"  # unknown: judged by the looser gate
    tensorrt_engine.report_path(plan).write_text(json.dumps({"precision": "fp32", "profile": {"maximum": 64}}))
    assert tensorrt_engine.engine_precision(plan) == "fp32"
    assert tensorrt_engine.engine_batch_limit(plan) == 64
