import numpy as np
import pytest

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.scoring.decision_policy import APPROVE, DECLINE, REVIEW, Thresholds, decide

POLICY = Thresholds(review=0.3, decline=0.6)


@pytest.mark.parametrize("probability, decision", [
    (0.0, APPROVE), (0.2999, APPROVE), (0.3, REVIEW), (0.5999, REVIEW), (0.6, DECLINE), (1.0, DECLINE),
    (float("nan"), REVIEW),
])
def test_probability_maps_to_the_decision_band(probability, decision):
    assert decide(np.array([[probability]], dtype=np.float32), POLICY)[0, 0] == decision


def test_decide_keeps_the_batch_shape_and_returns_bytes_objects():
    out = decide(np.array([[0.1], [0.4], [0.9]], dtype=np.float32), POLICY)
    assert out.shape == (3, 1) and out.dtype == object
    assert out.ravel().tolist() == [APPROVE, REVIEW, DECLINE]


@pytest.mark.parametrize("review, decline", [(0.7, 0.6), (-0.1, 0.5), (0.2, 1.5)])
def test_inconsistent_thresholds_are_refused(review, decline):
    with pytest.raises(ValueError, match="thresholds"):
        Thresholds(review, decline)


def test_thresholds_come_from_config_parameters():
    params = {"review_threshold": {"string_value": "0.25"}, "decline_threshold": {"string_value": "0.7"}}
    assert read_parameters(Thresholds, params) == Thresholds(0.25, 0.7)
    with pytest.raises(ValueError, match="decline_threshold is required"):
        read_parameters(Thresholds, {"review_threshold": {"string_value": "0.25"}})
    with pytest.raises(ValueError, match="expected a number"):
        read_parameters(Thresholds, {**params, "review_threshold": {"string_value": "low"}})
