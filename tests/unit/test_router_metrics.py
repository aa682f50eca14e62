import pytest

from backends.router_metrics import target_labels


@pytest.mark.parametrize("target, labels", [
    ("risk_scorer:3", {"model": "risk_scorer", "version": "3"}),
    ("risk_scorer_trt:12", {"model": "risk_scorer_trt", "version": "12"}),
    ("risk_scorer_lite", {"model": "risk_scorer_lite", "version": ""}),
])
def test_target_labels_split_model_and_version(target, labels):
    assert target_labels(target) == labels
