import os
from pathlib import Path

import pytest

from s2t.serve.service_process import S2T  # noqa: F401 - the tests take it from here
from s2t.serve.triton_server import free_port  # noqa: F401 - the tests take it from here

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
DATA_CSV = ARTIFACTS / "data" / "germancredit.csv"
SAVED_MODEL = ARTIFACTS / "legacy" / "risk_model"
SCORER_ONNX = ARTIFACTS / "onnx" / "risk_scorer.onnx"
MODEL_REPOSITORY = ROOT / "model_repository"
ENSEMBLES = ROOT / "ensembles"
GPU_REPOSITORY = ROOT / "model_repository_gpu"
LLM_REPOSITORY = ROOT / "model_repository_llm"


def has_gpu() -> bool:
    """A CUDA driver and GPU here (the TensorRT tests then build real engines instead of checking refusals)."""
    from s2t.models.tensorrt_engine import EngineBuildError, cuda_device
    try:
        cuda_device()
    except EngineBuildError:
        return False
    return True


@pytest.fixture(scope="session", autouse=True)
def shared_parity_reference(tmp_path_factory):
    """One cache of the legacy model's parity scores for the whole run, inherited by every `s2t` the tests start:
    each test publishes into a repository of its own, whose control area would otherwise start TensorFlow again.
    Keyed by content, so a test that changes the SavedModel or the data still gets its own reference.
    One directory for every xdist worker (the cache writes its entries atomically): one worker's reference serves the
    other's publishes too."""
    from s2t.gate.reference_cache import CACHE_ENV
    previous = os.environ.get(CACHE_ENV)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "parity-reference"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("parity-reference")
    os.environ[CACHE_ENV] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


@pytest.fixture(scope="session")
def built_artifacts():
    """The legacy model, its conversion and the data, as `make` builds them before the tests."""
    missing = [p for p in (DATA_CSV, SAVED_MODEL / "saved_model.pb", SCORER_ONNX) if not p.exists()]
    if missing:
        pytest.fail(f"run `make test` (it builds what the tests use); missing: {', '.join(map(str, missing))}")
    return {"data": DATA_CSV, "saved_model": SAVED_MODEL, "onnx": SCORER_ONNX}


@pytest.fixture(scope="session")
def german_credit_data(built_artifacts):
    from s2t.models import dataset
    return dataset.load(built_artifacts["data"])


@pytest.fixture(scope="session")
def legacy_scores(built_artifacts, german_credit_data):
    """The legacy SavedModel's probability for every German Credit row (TensorFlow runs once per session, and the
    parity gates of the run find them in the shared cache)."""
    from s2t.gate import parity
    return parity.reference_scores(built_artifacts["saved_model"], built_artifacts["data"], german_credit_data)


@pytest.fixture(scope="session")
def decision_thresholds():
    """The thresholds risk_pipeline decides with, from its config."""
    from s2t.triton_config import decision_thresholds
    return decision_thresholds(MODEL_REPOSITORY / "risk_pipeline")


@pytest.fixture(scope="session")
def feature_spec(built_artifacts):
    import onnx

    from s2t.models.convert import read_spec
    return read_spec(onnx.load(str(built_artifacts["onnx"])))


# Seconds of each test file (its tests' setup, call and teardown, its module's servers with them), summed as the
# reports come in: under xdist they reach the controlling process too, which prints the summary.
_SECONDS_BY_FILE: dict[str, float] = {}
SLOWEST_FILES = 40


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _SECONDS_BY_FILE[path] = _SECONDS_BY_FILE.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    """With --durations, the slowest files as well: the integration level hands out whole files, longest first
    (tests/integration/conftest.py LONGEST_FIRST), and these are the figures that order comes from."""
    if config.getoption("durations", None) is None or len(_SECONDS_BY_FILE) < 2:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST_FILES} files")
    for path, seconds in sorted(_SECONDS_BY_FILE.items(), key=lambda item: -item[1])[:SLOWEST_FILES]:
        terminalreporter.write_line(f"{seconds:8.2f}s {path}")
