"""Probability of bad credit -> APPROVE / REVIEW / DECLINE, for a whole batch at once."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2t.backends.runtime.model_parameters import parameter

APPROVE, REVIEW, DECLINE = b"APPROVE", b"REVIEW", b"DECLINE"
# Indexed by the band number (0 below review, 1 between, 2 from decline up): one gather per batch. On the hot path
# a batch is a few rows, and np.select over object arrays cost several times more than the whole comparison.
_BANDS = np.array([APPROVE, REVIEW, DECLINE], dtype=object)


@dataclass(frozen=True)
class Thresholds:
    """`review` <= p < `decline` is REVIEW; below `review` APPROVE; from `decline` up DECLINE."""

    review: float = parameter("review_threshold")
    decline: float = parameter("decline_threshold")

    def __post_init__(self):
        if not (0.0 <= self.review <= self.decline <= 1.0):
            raise ValueError(f"thresholds must satisfy 0 <= review <= decline <= 1, "
                             f"got review={self.review} decline={self.decline}")


def decide(probability: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    """Same shape as `probability`, BYTES (object) labels; NaN is never a silent APPROVE (it is REVIEW)."""
    p = np.asarray(probability)
    band = np.where(np.isnan(p), 1, (p >= thresholds.review).astype(np.intp) + (p >= thresholds.decline))
    return _BANDS[band]
