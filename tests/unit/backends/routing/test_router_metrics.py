import pytest

from s2t.backends.routing.router_metrics import target_labels


@pytest.mark.parametrize("target, labels", [
    ("risk_scorer:3", {"model": "risk_scorer", "version": "3"}),
    ("risk_scorer_trt:12", {"model": "risk_scorer_trt", "version": "12"}),
    ("risk_scorer_lite", {"model": "risk_scorer_lite", "version": ""}),
])
def test_target_labels_split_model_and_version(target, labels):
    assert target_labels(target) == labels


def _samples(family):
    return {tuple(sorted(m.labels.items())): m.value() for m in family.metrics}


def test_forced_rows_count_as_answered_and_forced_but_never_in_the_score_histogram():
    import numpy as np

    from s2t.backends.routing.router_core import BatchAnswer
    from s2t.backends.routing.router_metrics import RouterMetrics
    from tests.unit.python_backend import MetricFamily

    MetricFamily.families = {}
    clock = iter([0.0, 2.0, 4.0, 6.0])
    metrics = RouterMetrics(MetricFamily, clock=lambda: next(clock))
    served = ["risk_scorer:2"] * 6 + ["risk_scorer:1"] * 2
    forced = [True] * 4 + [False] * 4
    probability = np.array([[0.95]] * 4 + [[0.05]] * 4, dtype=np.float32)
    metrics.observe(BatchAnswer(probability, served, [None] * 8, forced=forced), "closed")
    metrics.observe(BatchAnswer(np.zeros((0, 1), np.float32), [], [], forced=[]), "closed")
    rows = _samples(MetricFamily.families["s2t_router_rows_total"])
    assert rows == {(("model", "risk_scorer"), ("version", "2")): 6, (("model", "risk_scorer"), ("version", "1")): 2}
    assert _samples(MetricFamily.families["s2t_router_forced_rows_total"]) == {
        (("model", "risk_scorer"), ("version", "2")): 4}
    scores = _samples(MetricFamily.families["s2t_router_score_bucket"])
    # Only the two unforced risk_scorer:2 rows (0.05) are in its histogram: none above 0.1.
    assert scores[(("le", "+Inf"), ("model", "risk_scorer"), ("version", "2"))] == 2
    assert scores[(("le", "0.1"), ("model", "risk_scorer"), ("version", "2"))] == 2
    assert scores[(("le", "+Inf"), ("model", "risk_scorer"), ("version", "1"))] == 2
