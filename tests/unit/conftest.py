"""The unit level's stand-ins for what `make models` builds, so `make unit` runs on a fresh clone before TensorFlow
has trained or converted anything: a tiny linear scorer written with onnx.helper (the converted scorer's inputs,
output and feature-spec metadata), a small data set drawn from its vocabularies, and private copies of the model
repositories with those files where `make` puts the real ones.

`built_artifacts` is overridden here, and so is every session fixture of tests/conftest.py that reads it: a root
fixture computed for a unit test would keep the stand-ins cached for the integration tests of the same run. Unit
tests check how the code treats a scorer, never the legacy model's numbers (parity against the SavedModel is the
integration level's job)."""
from __future__ import annotations

import csv
import gc
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.feature_spec import METADATA_KEY, CategoricalFeature, FeatureSpec
from tests.conftest import ENSEMBLES, LLM_REPOSITORY, MODEL_REPOSITORY, ROOT
from s2t.wire.names import CATEGORICAL, NUMERIC, PROBABILITY

EXAMPLE_RECORD = ROOT / "clients" / "examples" / "record.json"
DATA_ROWS = 240
# What `make models` writes into the repositories (the Makefile's ADAPTER_SPEC, ROUTER_SPEC, DRIFT_REFERENCE,
# EXPLAINER_REASONS and the published scorer versions); the stand-ins take their places.
BUILT_FILES = {"feature_spec.json", "drift_reference.json", "reason_model.onnx"}
BUILT_VERSIONS_OF = {"risk_scorer", "risk_scorer_lite"}


# A full collection walks every object the process tracks. Once TensorFlow, ONNX Runtime and gRPC are imported that
# is hundreds of thousands of long-lived objects, and each collection (a model glue's finalize makes one, as in a
# stub) costs about 0.3 s here against milliseconds in a stub. After a test that imported this many modules, what
# is alive is frozen (after one collection, so no garbage is): later collections walk only what later tests make.
FREEZE_AFTER_NEW_MODULES = 100
_modules_when_frozen = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    global _modules_when_frozen
    yield
    if len(sys.modules) - _modules_when_frozen >= FREEZE_AFTER_NEW_MODULES:
        gc.collect()
        gc.freeze()
        _modules_when_frozen = len(sys.modules)


def tiny_spec() -> FeatureSpec:
    """The legacy attributes as the example record names them; each category's vocabulary is the example's value
    and two more (index 0 stays the out-of-vocabulary default, as in a converted model)."""
    features = json.loads(EXAMPLE_RECORD.read_text())["features"]
    categorical = tuple(CategoricalFeature(name, {value: 1, f"{name} other": 2, f"{name} rare": 3}, 0)
                        for name, value in features.items() if isinstance(value, str))
    numeric = tuple(name for name, value in features.items() if not isinstance(value, str))
    return FeatureSpec(categorical, numeric)


def tiny_scorer(spec: FeatureSpec) -> onnx.ModelProto:
    """A logistic regression over the packed inputs, shaped as `s2t convert` leaves the legacy model: one Concat of
    per-attribute encodings named `<attribute>_lookup/...` and `<attribute>_norm/...`, one MatMul to one output, a
    bias and a sigmoid (so risk_explainer's reason codes read it as they read the linear fallback scorer)."""
    nodes, initializers, parts = [], [], []
    for source, names, kind in ((CATEGORICAL, [f.name for f in spec.categorical], "lookup"),
                                (NUMERIC, list(spec.numeric), "norm")):
        for column, name in enumerate(names):
            index = numpy_helper.from_array(np.array([column], np.int64), f"{name}_{kind}/column")
            initializers.append(index)
            nodes.append(helper.make_node("Gather", [source, index.name], [f"{name}_{kind}/raw"], axis=1))
            nodes.append(helper.make_node("Cast", [f"{name}_{kind}/raw"], [f"{name}_{kind}/value"],
                                          to=TensorProto.FLOAT))
            if kind == "norm":
                scale = numpy_helper.from_array(np.array(1.0 / (10.0 + 100.0 * column), np.float32),
                                                f"{name}_norm/scale")
                initializers.append(scale)
                nodes.append(helper.make_node("Mul", [f"{name}_norm/value", scale.name], [f"{name}_norm/scaled"]))
                parts.append(f"{name}_norm/scaled")
            else:
                parts.append(f"{name}_lookup/value")
    weights = np.linspace(-0.4, 0.4, len(parts), dtype=np.float32).reshape(-1, 1)
    initializers += [numpy_helper.from_array(weights, "linear/weights"),
                     numpy_helper.from_array(np.array([-0.2], np.float32), "linear/bias")]
    nodes += [helper.make_node("Concat", parts, ["encoded"], axis=1),
              helper.make_node("MatMul", ["encoded", "linear/weights"], ["linear/logit"]),
              helper.make_node("Add", ["linear/logit", "linear/bias"], ["linear/biased"]),
              helper.make_node("Sigmoid", ["linear/biased"], [PROBABILITY])]
    graph = helper.make_graph(
        nodes, "tiny_risk_scorer",
        [helper.make_tensor_value_info(CATEGORICAL, TensorProto.INT64, ["batch", len(spec.categorical)]),
         helper.make_tensor_value_info(NUMERIC, TensorProto.FLOAT, ["batch", len(spec.numeric)])],
        [helper.make_tensor_value_info(PROBABILITY, TensorProto.FLOAT, ["batch", 1])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    helper.set_model_props(model, {METADATA_KEY: spec.to_json()})
    onnx.checker.check_model(model)
    return model


def write_data(spec: FeatureSpec, path: Path, rows: int = DATA_ROWS, seed: int = 7) -> Path:
    """A German-Credit-shaped CSV: categories from the vocabularies, whole numbers, and the target column."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*spec.names, "creditability"])
        for _ in range(rows):
            writer.writerow([*(rng.choice(sorted(feature.vocabulary)) for feature in spec.categorical),
                             *(int(rng.integers(1, 60)) for _ in spec.numeric),
                             rng.choice(["good", "bad"])])
    return path


def _without_built_files(folder: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in BUILT_FILES or n == "__pycache__"}
    if Path(folder).name in BUILT_VERSIONS_OF:
        skipped |= {n for n in names if n[:1].isdigit()}
    return skipped


@pytest.fixture(scope="session")
def built_artifacts(tmp_path_factory):
    """The tiny scorer and data where the real ones would be (no SavedModel: unit tests never run TensorFlow)."""
    folder = tmp_path_factory.mktemp("artifacts")
    spec = tiny_spec()
    onnx.save(tiny_scorer(spec), str(folder / "risk_scorer.onnx"))
    return {"data": write_data(spec, folder / "germancredit.csv"), "onnx": folder / "risk_scorer.onnx",
            "saved_model": None}


@pytest.fixture(scope="session")
def german_credit_data(built_artifacts):
    from s2t.models import dataset
    return dataset.load(built_artifacts["data"])


@pytest.fixture(scope="session")
def feature_spec(built_artifacts):
    from s2t.models.convert import read_spec
    return read_spec(onnx.load(str(built_artifacts["onnx"])))


@pytest.fixture(scope="session")
def legacy_scores():
    pytest.fail("unit tests never run the legacy TensorFlow model: parity tests belong in tests/integration")


@pytest.fixture(scope="session")
def repositories(tmp_path_factory, built_artifacts) -> dict[str, Path]:
    """Copies of model_repository, ensembles and model_repository_llm as `make models` leaves them, built files
    replaced by the stand-ins (version 1 of each scorer, the specs, the drift reference, the reason model).
    Session-wide and shared: tests that change a repository copy it first."""
    from s2t.gate.drift import build_reference

    root = tmp_path_factory.mktemp("repositories")
    repos = {"model_repository": root / "model_repository", "ensembles": root / "ensembles",
             "model_repository_llm": root / "model_repository_llm"}
    for source, name in ((MODEL_REPOSITORY, "model_repository"), (ENSEMBLES, "ensembles"),
                         (LLM_REPOSITORY, "model_repository_llm")):
        shutil.copytree(source, repos[name], ignore=_without_built_files)
    scorer, spec_json = built_artifacts["onnx"], tiny_spec().to_json()
    models = repos["model_repository"]
    for model in BUILT_VERSIONS_OF:
        (models / model / "1").mkdir()
        shutil.copy(scorer, models / model / "1" / "model.onnx")
    for model in ("skill_adapter", "risk_router"):
        (models / model / "1" / "feature_spec.json").write_text(spec_json + "\n")
    build_reference(built_artifacts["data"], scorer, models / "risk_router" / "1" / "drift_reference.json")
    shutil.copy(scorer, repos["model_repository_llm"] / "risk_explainer" / "1" / "reason_model.onnx")
    return repos


@pytest.fixture(scope="session")
def model_repository(repositories) -> Path:
    return repositories["model_repository"]
