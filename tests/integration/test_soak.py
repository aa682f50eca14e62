"""`s2t soak` in a short run: the report names every serving process, counts answers, and computes growth."""
import json
import subprocess

from tests.conftest import ROOT, S2T
from s2t.exit_codes import GATE_REFUSED



def test_short_soak_reports_rss_of_the_server_and_every_stub_and_no_errors(built_artifacts, tmp_path):
    report = tmp_path / "soak.json"
    done = subprocess.run([str(S2T), "soak", "--minutes", "0.25", "--rate", "50", "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert report.is_file(), done.stdout + done.stderr
    result = json.loads(report.read_text())
    assert result["error_count"] == 0, result["errors"]
    assert result["sent"] == result["answered"] and result["sent"] >= 600
    processes = set(result["samples"][-1]["rss"])
    assert "tritonserver" in processes and {"skill_adapter_0_0@1", "risk_decision_0_0@1"} <= processes
    assert any(p.startswith("risk_scorer_0_0@") for p in processes)
    assert set(result["growth"]) == processes and all(isinstance(g, float) for g in result["growth"].values())
    # 15 s cannot tell warm-up from a leak, so either verdict may come; the exit code must be the one it states.
    assert "total" in done.stdout
    # Progress goes to stderr, a line per tenth of the planned seconds on a pipe, with the requests so far.
    progress = [line for line in done.stderr.splitlines() if line.startswith("soak: ")]
    assert 2 <= len(progress) <= 11 and progress[0] == "soak: sent 0, answered 0, errors 0: 0/15 s (0%)"
    assert progress[-1].startswith(f"soak: sent {result['sent']}, ") and ": 15/15 s (100%) after " in progress[-1]
    assert done.stdout.startswith("soak: 15 s at 50 records/s: ") and "/15 s (" not in done.stdout
    grew = max(result["growth"].values()) >= 0.05
    assert done.returncode == (GATE_REFUSED if grew else 0), done.stdout + done.stderr
