from pathlib import Path

import pytest

from tools.triton_server import free_port  # noqa: F401 - the tests take it from here

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
DATA_CSV = ARTIFACTS / "data" / "germancredit.csv"
SAVED_MODEL = ARTIFACTS / "legacy" / "risk_model"
SCORER_ONNX = ARTIFACTS / "onnx" / "risk_scorer.onnx"
MODEL_REPOSITORY = ROOT / "model_repository"
ENSEMBLES = ROOT / "ensembles"


@pytest.fixture(scope="session")
def built_artifacts():
    """The legacy model, its conversion and the data, as `make` builds them before the tests."""
    missing = [p for p in (DATA_CSV, SAVED_MODEL / "saved_model.pb", SCORER_ONNX) if not p.exists()]
    if missing:
        pytest.fail(f"run `make test` (it builds what the tests use); missing: {', '.join(map(str, missing))}")
    return {"data": DATA_CSV, "saved_model": SAVED_MODEL, "onnx": SCORER_ONNX}


@pytest.fixture(scope="session")
def german_credit_data(built_artifacts):
    from tools import german_credit
    return german_credit.load(built_artifacts["data"])


@pytest.fixture(scope="session")
def feature_spec(built_artifacts):
    import onnx

    from tools.convert import read_spec
    return read_spec(onnx.load(str(built_artifacts["onnx"])))
