"""`s2t bench --mode cutover` end to end on a short plan: the three columns are measured and every call answered."""
import json
import subprocess

from tests.conftest import S2T


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
    # Progress: the plan's steps on stderr, a line per tenth on a pipe, the whole reached when the results are in.
    progress = [line for line in run.stderr.splitlines() if line.startswith("bench cutover-smoke: ")]
    assert progress[0] == "bench cutover-smoke: legacy service starting: 0/9 steps (0%)" and len(progress) <= 11
    assert progress[-1].startswith(f"bench cutover-smoke: results in {tmp_path / 'cutover-smoke'}: 9/9 steps (100%)")
    assert sum("9/9 steps" in line for line in progress) == 1 and "steps (" not in run.stdout
