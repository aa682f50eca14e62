"""A refused gate exits GATE_REFUSED through the real `s2t`, with the figures that refused it, and changes nothing."""
import json
import shutil
import subprocess

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, ROOT, S2T
from tests.samples import shifted_model
from s2t.errors import GATE_REFUSED
from s2t.control.version_store import VersionStore



def test_parity_over_tolerance_exits_gate_refused_with_its_report(built_artifacts):
    done = subprocess.run([str(S2T), "parity", "--saved-model", str(built_artifacts["saved_model"]), "--onnx",
                           str(built_artifacts["onnx"]), "--data", str(built_artifacts["data"]), "--atol", "0",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == GATE_REFUSED, done.stderr
    report = json.loads(done.stdout)
    assert not report["passed"] and report["comparisons"][0]["rows_over_tolerance"] > 0
    assert "FAIL" in done.stderr
    # Progress goes to stderr (stdout parsed as JSON above): on a pipe, a start and an end line per side and for the
    # localisation.
    progress = [line.split(" after ")[0] for line in done.stderr.splitlines() if line.startswith("parity: ")]
    worst = report["comparisons"][0]["worst_row"]
    assert progress == ["parity: legacy SavedModel: 0/1000 rows (0%)",
                        "parity: legacy SavedModel: 1000/1000 rows (100%)",
                        "parity: onnxruntime risk_scorer.onnx: 0/1000 rows (0%)",
                        "parity: onnxruntime risk_scorer.onnx: 1000/1000 rows (100%)",
                        f"parity: first diverging node, on the worst row ({worst}): 0/1 rows (0%)",
                        f"parity: first diverging node, on the worst row ({worst}): 1/1 rows (100%)"]


def test_publish_of_a_model_that_scores_differently_exits_gate_refused_and_adds_no_version(built_artifacts,
                                                                                            tmp_path):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ENSEMBLES, tmp_path / "ensembles", ignore=shutil.ignore_patterns("__pycache__"))
    before = VersionStore(repository).served("risk_scorer")
    shifted = shifted_model(built_artifacts["onnx"], tmp_path / "shifted.onnx", 0.05)
    done = subprocess.run([str(S2T), "publish", "risk_scorer", str(shifted), "--repository", str(repository),
                           "--saved-model", str(built_artifacts["saved_model"]), "--data", str(built_artifacts["data"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == GATE_REFUSED, done.stderr
    assert "parity gate failed" in done.stderr and done.stdout == ""
    assert VersionStore(repository).served("risk_scorer") == before
