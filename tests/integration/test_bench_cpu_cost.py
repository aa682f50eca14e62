"""`python -m s2t.bench.cpu_cost` against real servers: two sides (this tree's code, and a config knob) take turns
and each round's CPU per request is read from the server's process tree; no timed assertions."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import DATA_CSV, MODEL_REPOSITORY, ROOT


@pytest.fixture(scope="module")
def cost_run(built_artifacts, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_cost")
    sides = ["--side", "base", "--side", "two:instances=2"]
    if shutil.which("h2load"):
        sides += ["--side", "grpc:client=h2load"]
    proc = subprocess.run([sys.executable, "-m", "s2t.bench.cpu_cost", *sides, "--rounds", "2", "--seconds", "1",
                           "--concurrency", "4", "--repository", str(MODEL_REPOSITORY), "--data", str(DATA_CSV),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


def test_every_side_is_measured_in_every_round_with_its_cpu_per_request(cost_run):
    results, _ = cost_run
    assert set(results["measured"]) >= {"base", "two"}
    for side, rounds in results["measured"].items():
        assert len(rounds) == 2, side
        for entry in rounds:
            assert entry["requests"] > 0 and entry["errors"] == 0, (side, entry)
            assert entry["server_cpu_us_per_request"] > 0 and entry["mean_batch"] >= 1, (side, entry)
            assert entry["server_cpu_us_per_request"] == pytest.approx(
                entry["front_end_cpu_us_per_request"] + entry["stubs_cpu_us_per_request"], abs=0.2)
    assert results["relative_server_cpu_per_request"]["base"] == 1.0
    assert results["sides"]["two"]["server"] == {"instances": "2"}


def test_the_report_names_each_side_and_says_whether_the_machine_was_quiet(cost_run):
    results, text = cost_run
    assert all(f"| {side} |" in text for side in results["measured"])
    assert ("busy machine" in text) != results["load"]["publishable"]
