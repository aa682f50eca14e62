"""`s2t bench --mode cutover` end to end on a short plan: the three columns are measured and every call answered,
the answers compared, the machine's load watched and the acceptance printed as pass/fail lines."""
import json
import subprocess

from s2t.bench.scenarios import cutover_acceptance
from tests.conftest import S2T
from tests.integration.bench_load import assert_load_follows_the_rule


def test_cutover_bench_measures_legacy_gateway_and_triton_with_no_failed_call(built_artifacts, tmp_path):
    run = subprocess.run([str(S2T), "bench", "--mode", "cutover-smoke", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "cutover-smoke" / "results.json").read_text())
    for side in ("legacy", "gateway", "triton"):
        measured = results[side]
        assert measured["latency"]["calls"] > 0 and measured["throughput"]["calls"] > 0, side
        assert measured["latency"]["errors"] == measured["throughput"]["errors"] == 0, side
        assert measured["peak_rss_bytes"] > 50 * 2**20 and measured["cold_start_s"] > 0, side
    assert "| cold start, s |" in run.stdout and "design document" in run.stdout
    # Cold start is the clock a user sees: `s2t serve`'s launch to every model ready, then the gateway's own.
    assert results["triton"]["cold_start_s"] == results["triton"]["serve_start_s"] > 0
    assert results["gateway"]["cold_start_s"] == results["gateway"]["serve_start_s"] + results["gateway"]["gateway_start_s"]
    # Memory of the whole serving tree: s2t serve, tritonserver (risk_pipeline runs inside it) and the stubs.
    served = " ".join(results["triton"]["rss_after_load_by_process"])
    assert "s2t" in served and "tritonserver" in served and "skill_adapter" in served, served
    # Every record scored on every side, and the same answers.
    answers = results["answers"]
    assert answers["compared"] >= 900 and answers["unanswered"] == answers["unanswered_triton"] == 0
    assert answers["max_abs_diff_gateway"] <= 1e-5 and answers["max_abs_diff_triton"] <= 1e-5
    # All three up at once, measured in turns: each side's latency run and throughput run is a turn, and the order
    # rotates: round 2 starts with the second turn of round 1, round 1's first comes last.
    sides = ("legacy service", "gateway -> Triton", "Triton directly")
    turns = [f"{side}: {run}" for run in ("latency", "throughput") for side in sides]
    assert_load_follows_the_rule(results, [f"{turn}, round 1" for turn in turns]
                                 + [f"{turn}, round 2" for turn in turns[1:] + turns[:1]], run.stdout)
    assert "measured in turns, 2 rounds each" in run.stdout
    # What the sides waiting for their turn cost the measured one: recorded, and small (they only wait).
    idle = [results[side]["idle_sides_cpu_share"] for side in ("legacy", "gateway", "triton")]
    assert all(0 <= share < 0.1 for share in idle), idle
    assert f"the waiting sides used at most {max(idle):.1%} of the CPU" in run.stdout
    # The acceptance, recomputed from the figures beside it, printed as one line per promise.
    assert results["acceptance"] == cutover_acceptance.summary(results)
    printed = [line for line in run.stdout.splitlines() if line.startswith(("- PASS: ", "- FAIL: "))]
    assert len(printed) == len(results["acceptance"]["checks"]) == 9
    assert "Acceptance, gateway path against the legacy service:" in run.stdout
    # Progress: the plan's steps on stderr, a line per tenth on a pipe, the whole reached when the results are in.
    progress = [line for line in run.stderr.splitlines() if line.startswith("bench cutover-smoke: ")]
    assert progress[0] == "bench cutover-smoke: legacy service starting: 0/15 steps (0%)" and len(progress) <= 11
    assert progress[-1].startswith(f"bench cutover-smoke: results in {tmp_path / 'cutover-smoke'}: 15/15 steps "
                                   "(100%)")
    assert sum("15/15 steps" in line for line in progress) == 1 and "steps (" not in run.stdout
