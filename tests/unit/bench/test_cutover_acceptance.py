"""The cutover acceptance as printed pass/fail lines: gateway path against the legacy service on every promise."""
import copy

import pytest

from s2t.bench.scenarios import cutover_acceptance
from s2t.bench.scenarios.cutover_acceptance import checks, markdown_lines, summary

MB = 2**20


def side(records_per_s, avg_ms, p99_ms, load_avg_ms, load_p99_ms, peak_mb, cold_s, errors=0, reasons=None):
    run = {"calls": 100, "records": 3200, "seconds": 1.0, "p50_ms": avg_ms, "errors": 0, "error_reasons": {}}
    return {"records_per_s": records_per_s, "peak_rss_bytes": peak_mb * MB, "cold_start_s": cold_s,
            "latency": {**run, "avg_ms": avg_ms, "p99_ms": p99_ms},
            "throughput": {**run, "avg_ms": load_avg_ms, "p99_ms": load_p99_ms, "errors": errors,
                           "error_reasons": reasons or {}}}


def passing() -> dict:
    return {"plan": {"callers": 8, "records_per_call": 32},
            "legacy": side(3000, 10.0, 20.0, 80.0, 160.0, 900, 5.0),
            "gateway": side(4600, 8.0, 15.0, 50.0, 90.0, 600, 2.5),
            "answers": {"compared": 992, "max_abs_diff_gateway": 1.2e-7, "unanswered": 0}}


def failed(results: dict) -> list[str]:
    return [c.name for c in checks(results) if not c.passed]


def test_a_gateway_better_on_every_promise_meets_the_acceptance():
    found = summary(passing())
    assert found["met"] and len(found["checks"]) == 9
    lines = markdown_lines(found)
    assert lines[0].startswith("Acceptance, gateway path against the legacy service: 9/9 met")
    assert sum(line.startswith("- PASS: ") for line in lines) == 9


@pytest.mark.parametrize("change, failing", [
    (lambda r: r["gateway"].update(records_per_s=4499), "records/s >= 1.5x"),   # 1.4997x
    (lambda r: r["gateway"]["latency"].update(avg_ms=10.0), "mean call latency, 1 caller"),  # equal is not below
    (lambda r: r["gateway"]["latency"].update(p99_ms=21.0), "p99 call latency, 1 caller"),
    (lambda r: r["gateway"]["throughput"].update(p99_ms=170.0), "p99 call latency, 8 callers"),
    (lambda r: r["gateway"]["throughput"].update(avg_ms=81.0), "mean call latency, 8 callers"),
    (lambda r: r["gateway"]["throughput"].update(errors=3, error_reasons={"RESOURCE_EXHAUSTED": 3}),
     "zero refused or failed calls"),
    (lambda r: r["answers"].update(max_abs_diff_gateway=2e-5), "answers equal"),
    (lambda r: r["answers"].update(unanswered=1), "answers equal"),
    (lambda r: r.pop("answers"), "answers equal"),
    (lambda r: r["gateway"].update(peak_rss_bytes=900 * MB), "peak memory"),
    (lambda r: r["gateway"].update(cold_start_s=5.0), "cold start"),
    (lambda r: r["plan"].update(callers=16), "records/s >= 1.5x"),                # not the acceptance plan
    (lambda r: r["legacy"].update(records_per_s=0), "records/s >= 1.5x"),       # nothing to compare against
])
def test_each_promise_fails_alone(change, failing):
    results = copy.deepcopy(passing())
    change(results)
    found = failed(results)
    assert len(found) == 1 and found[0].startswith(failing), found


def test_the_lines_say_what_was_measured_and_why_a_check_failed():
    results = passing()
    results["gateway"]["throughput"].update(errors=5, error_reasons={"RESOURCE_EXHAUSTED": 5})
    results["gateway"]["records_per_s"] = 3000 * 1.25
    lines = markdown_lines(summary(results))
    assert "7/9 met (NOT MET)" in lines[0]
    assert any(line.startswith("- FAIL: records/s >= 1.5x") and "1.25x (3,750 vs 3,000)" in line for line in lines)
    assert any(line.startswith("- FAIL: zero refused") and "5 failed (RESOURCE_EXHAUSTED 5)" in line for line in lines)
    assert cutover_acceptance.MIN_THROUGHPUT_RATIO == 1.5 and cutover_acceptance.ANSWER_TOLERANCE == 1e-5
