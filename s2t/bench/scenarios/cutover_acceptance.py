"""Whether a `s2t bench --mode cutover` run meets the migration's acceptance: legacy callers better off through
the gateway than on the legacy service, on every figure the design's before/after table promises. Pure logic over
the run's results.json, so that the printed pass/fail lines and the tests read the same rule."""
from __future__ import annotations

from dataclasses import asdict, dataclass

# The acceptance plan: 8 callers, calls of 32 records. A run with another plan is reported, but cannot pass.
CALLERS = 8
RECORDS_PER_CALL = 32
MIN_THROUGHPUT_RATIO = 1.5
ANSWER_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Check:
    name: str
    measured: str
    passed: bool


def _ratio(numerator: float, denominator: float) -> float:
    """NaN where the legacy side measured nothing: no comparison, so no check passes on it."""
    return numerator / denominator if denominator else float("nan")


def checks(results: dict) -> list[Check]:
    """The acceptance, one check per promise, gateway path against the legacy service."""
    legacy, gateway, plan = results["legacy"], results["gateway"], results["plan"]
    out = []
    ratio = _ratio(gateway["records_per_s"], legacy["records_per_s"])
    acceptance_plan = plan["callers"] == CALLERS and plan["records_per_call"] == RECORDS_PER_CALL
    out.append(Check(f"records/s >= {MIN_THROUGHPUT_RATIO}x the legacy's ({CALLERS} callers, calls of "
                     f"{RECORDS_PER_CALL} records)",
                     f"{ratio:.2f}x ({gateway['records_per_s']:,.0f} vs {legacy['records_per_s']:,.0f})"
                     + ("" if acceptance_plan else f"; plan was {plan['callers']} callers x "
                                                   f"{plan['records_per_call']} records"),
                     acceptance_plan and ratio >= MIN_THROUGHPUT_RATIO))
    for run, field, label in (("latency", "avg_ms", "mean call latency, 1 caller"),
                              ("latency", "p99_ms", "p99 call latency, 1 caller"),
                              ("throughput", "avg_ms", f"mean call latency, {plan['callers']} callers"),
                              ("throughput", "p99_ms", f"p99 call latency, {plan['callers']} callers")):
        mine, theirs = gateway[run][field], legacy[run][field]
        out.append(Check(f"{label} below the legacy's", f"{mine:.1f} vs {theirs:.1f} ms "
                                                        f"({_ratio(mine, theirs):.2f}x)", mine < theirs))
    failed = gateway["latency"]["errors"] + gateway["throughput"]["errors"]
    reasons: dict[str, int] = {}
    for run in ("latency", "throughput"):
        for reason, n in gateway[run]["error_reasons"].items():
            reasons[reason] = reasons.get(reason, 0) + n
    out.append(Check("zero refused or failed calls",
                     f"{failed} failed" + (f" ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})"
                                          if reasons else ""), failed == 0))
    answers = results.get("answers")
    if answers is None:
        out.append(Check(f"answers equal the legacy's within {ANSWER_TOLERANCE:g}", "not compared", False))
    else:
        diff = answers["max_abs_diff_gateway"]
        out.append(Check(f"answers equal the legacy's within {ANSWER_TOLERANCE:g}",
                         f"max |diff| {diff:.2e} over {answers['compared']} records, "
                         f"{answers['unanswered']} unanswered",
                         answers["compared"] > 0 and answers["unanswered"] == 0 and diff <= ANSWER_TOLERANCE))
    mb = 2**20
    out.append(Check("peak memory below the legacy's",
                     f"{gateway['peak_rss_bytes'] / mb:,.0f} vs {legacy['peak_rss_bytes'] / mb:,.0f} MB",
                     gateway["peak_rss_bytes"] < legacy["peak_rss_bytes"]))
    out.append(Check("cold start below the legacy's",
                     f"{gateway['cold_start_s']:.2f} vs {legacy['cold_start_s']:.2f} s",
                     gateway["cold_start_s"] < legacy["cold_start_s"]))
    return out


def summary(results: dict) -> dict:
    found = checks(results)
    return {"met": all(c.passed for c in found), "checks": [asdict(c) for c in found]}


def markdown_lines(summary: dict) -> list[str]:
    passed = sum(c["passed"] for c in summary["checks"])
    lines = [f"Acceptance, gateway path against the legacy service: {passed}/{len(summary['checks'])} met"
             + ("." if summary["met"] else " (NOT MET)."), ""]
    lines += [f"- {'PASS' if c['passed'] else 'FAIL'}: {c['name']}: {c['measured']}" for c in summary["checks"]]
    return lines + [""]
