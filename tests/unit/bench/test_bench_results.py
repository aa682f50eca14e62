"""How bench modes summarise latencies (s2t/bench/harness/latency.py) and write their results (report.write_files)."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from s2t.bench.harness.latency import LatencySummary
from s2t.bench.harness.report import write_files


def test_no_call_is_nan_not_zero():
    summary = LatencySummary.of_seconds([])
    assert summary.calls == 0 and all(math.isnan(v) for v in (summary.mean_ms, summary.p50_ms, summary.p99_ms))


@pytest.mark.parametrize("durations_s, p50_ms, p99_ms, mean_ms", [
    ([0.002], 2.0, 2.0, 2.0),
    ([0.001, 0.003], 2.0, 2.98, 2.0),
    ([0.001] * 99 + [0.101], 1.0, 2.0, 2.0),
])
def test_percentiles_are_in_milliseconds(durations_s, p50_ms, p99_ms, mean_ms):
    summary = LatencySummary.of_seconds(durations_s)
    assert (summary.p50_ms, summary.p99_ms, summary.mean_ms) == pytest.approx((p50_ms, p99_ms, mean_ms))


@given(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_are_ordered_and_within_the_calls(durations_s):
    s = LatencySummary.of_seconds(durations_s)
    low, high = min(durations_s) * 1000, max(durations_s) * 1000
    assert s.calls == len(durations_s)
    assert low - 1e-9 <= s.p50_ms <= s.p95_ms + 1e-9 <= s.p99_ms + 2e-9 <= high + 3e-9
    assert s.mean_ms == pytest.approx(float(np.mean(durations_s)) * 1000)


def test_results_are_written_as_json_and_markdown_with_one_final_newline(tmp_path):
    out = tmp_path / "new" / "run"
    write_files(out, {"p99_ms": np.float32(1.5), "rows": 3}, "| a |\n|---|\n\n")
    assert json.loads((out / "results.json").read_text()) == {"p99_ms": 1.5, "rows": 3}
    assert (out / "results.md").read_text() == "| a |\n|---|\n"
    write_files(out, {"points": []}, name="crossover")
    assert json.loads((out / "crossover.json").read_text()) == {"points": []} and not (out / "crossover.md").exists()
