import pytest

from s2t.gate.canary_analysis import Limits, StepFigures, breaches, figures, judgeable, parse_duration
from s2t.prometheus_text import parse_metrics

PRIMARY, CANDIDATE = "risk_scorer:1", "risk_scorer:2"
CANDIDATE_LABELS = 'model="risk_scorer",version="2"'


def scores(served_by, counts):
    """Cumulative score buckets as risk_router exports them, from per-bin counts over the ten 0.1-wide bins."""
    lines, total = [], 0
    for i, count in enumerate(counts, start=1):
        total += count
        model, version = served_by.split(":")
        lines.append(f's2t_router_score_bucket{{model="{model}",version="{version}",le="{i / 10:g}"}} {total}')
    return lines


def metrics(*lines):
    return parse_metrics("# HELP x\n" + "\n".join(lines) + "\n")


def test_metrics_text_is_read_by_name_and_labels():
    parsed = metrics(f's2t_router_failed_rows_total{{{CANDIDATE_LABELS}}} 3', "plain_total 7")
    labels = frozenset({("model", "risk_scorer"), ("version", "2")})
    assert parsed[("s2t_router_failed_rows_total", labels)] == 3.0
    assert parsed[("plain_total", frozenset())] == 7.0


def test_canary_figures_are_the_deltas_over_the_interval():
    before = metrics(*scores(PRIMARY, [10] * 10), *scores(CANDIDATE, [1] * 10))
    after = metrics(*scores(PRIMARY, [20] * 10), *scores(CANDIDATE, [2] * 10),
                    f's2t_router_failed_rows_total{{{CANDIDATE_LABELS}}} 2',
                    f's2t_router_call_seconds_bucket{{{CANDIDATE_LABELS},le="0.01"}} 98',
                    f's2t_router_call_seconds_bucket{{{CANDIDATE_LABELS},le="0.05"}} 100',
                    f's2t_router_call_seconds_bucket{{{CANDIDATE_LABELS},le="+Inf"}} 100')
    step = figures(before, after, "canary", 10, PRIMARY, CANDIDATE)
    assert (step.candidate_rows, step.primary_rows, step.failed_rows) == (10, 100, 2)
    assert step.p99_seconds == 0.05 and step.psi == pytest.approx(0.0)


def test_shadow_figures_are_the_mean_difference_on_mirrored_records():
    before = metrics(f's2t_router_shadow_abs_diff_count{{{CANDIDATE_LABELS}}} 10',
                     f's2t_router_shadow_abs_diff_sum{{{CANDIDATE_LABELS}}} 0.5')
    after = metrics(f's2t_router_shadow_abs_diff_count{{{CANDIDATE_LABELS}}} 110',
                    f's2t_router_shadow_abs_diff_sum{{{CANDIDATE_LABELS}}} 5.5')
    step = figures(before, after, "shadow", 10, PRIMARY, CANDIDATE)
    assert step.candidate_rows == 100 and step.shadow_mean_diff == pytest.approx(0.05)


@pytest.mark.parametrize("step, found", [
    (StepFigures("shadow", 10, 100, 0, shadow_mean_diff=0.05), ["shadow mean |candidate - primary| 0.0500 > 0.01"]),
    (StepFigures("shadow", 10, 100, 0, shadow_mean_diff=0.0), []),
    (StepFigures("canary", 10, 98, 900, failed_rows=2, p99_seconds=0.01, psi=0.01), ["error rate 0.020 > 0.01"]),
    (StepFigures("canary", 10, 300, 900, p99_seconds=0.5, psi=0.01), ["p99 500 ms > 250 ms"]),
    (StepFigures("canary", 10, 300, 900, p99_seconds=0.01, psi=0.4),
     ["PSI of the candidate's scores vs the primary's 0.400 > 0.25"]),
    (StepFigures("canary", 10, 50, 900, p99_seconds=0.01, psi=0.4), []),  # too few records for PSI
])
def test_each_limit_is_a_breach_with_its_figure(step, found):
    assert breaches(step, Limits()) == found


def test_a_step_with_too_few_candidate_records_is_not_judged():
    assert not judgeable(StepFigures("canary", 10, 5, 900), Limits(min_rows=30))


@pytest.mark.parametrize("text, seconds", [("60s", 60), ("2m", 120), ("500ms", 0.5), ("3", 3), ("1.5s", 1.5)])
def test_durations_read_with_their_unit(text, seconds):
    assert parse_duration(text) == seconds


def test_a_duration_without_a_known_unit_is_refused():
    with pytest.raises(ValueError, match="ms, s, m or h"):
        parse_duration("5 days")
