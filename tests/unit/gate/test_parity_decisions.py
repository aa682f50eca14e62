"""Parity compares decisions too: a candidate within tolerance can still move a row across a threshold."""
import numpy as np
import pytest

from s2t.backends.scoring.decision_policy import Thresholds
from s2t.gate.parity import FP16_ATOL, compare, near_threshold

THRESHOLDS = Thresholds(review=0.3, decline=0.6)


@pytest.mark.parametrize("reference, scores, changed", [
    ([0.1, 0.5, 0.9], [0.1, 0.5, 0.9], []),
    ([0.29999, 0.5, 0.9], [0.30001, 0.5, 0.9], [0]),  # APPROVE -> REVIEW within 1e-4
    ([0.1, 0.59995, 0.60001], [0.1, 0.60005, 0.59999], [1, 2]),  # across DECLINE both ways
    ([0.2, 0.4], [np.nan, 0.4], [0]),  # NaN is REVIEW, never a silent APPROVE
])
def test_rows_whose_decision_changes_are_listed(reference, scores, changed):
    comparison = compare("candidate", np.array(reference), np.array(scores), atol=1e-3, thresholds=THRESHOLDS)
    assert comparison.decisions_changed == changed


def test_without_thresholds_decisions_are_not_judged():
    assert compare("candidate", np.array([0.29]), np.array([0.31]), atol=1.0).decisions_changed is None


def test_a_comparison_records_the_tolerance_it_was_judged_at():
    comparison = compare("fp16", np.array([0.5]), np.array([0.5005]), atol=FP16_ATOL)
    assert comparison.atol == FP16_ATOL and comparison.passed


def test_rows_near_a_threshold_are_the_ones_a_low_precision_engine_could_flip():
    reference = np.array([0.3 - FP16_ATOL / 2, 0.45, 0.6 + FP16_ATOL / 4, 0.6 + 2 * FP16_ATOL])
    assert near_threshold(reference, THRESHOLDS) == [0, 2]
