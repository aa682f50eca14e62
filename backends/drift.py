"""Population stability index (PSI): how far one distribution over fixed bins has moved from another.

PSI = sum over bins of (actual% - expected%) * ln(actual% / expected%). Rules of thumb used in credit risk:
below 0.1 no shift, 0.1-0.25 a moderate one, above 0.25 (0.2 for single features in many shops) a significant one.
Empty bins get a small floor so that a bin seen on one side only counts as a large, finite shift.
"""
from __future__ import annotations

import numpy as np

EMPTY_BIN_SHARE = 1e-4


def psi(expected_counts, actual_counts) -> float:
    """PSI of `actual` against `expected`, both counts over the same bins; NaN when either side has no count."""
    expected = np.asarray(expected_counts, dtype=np.float64)
    actual = np.asarray(actual_counts, dtype=np.float64)
    if expected.shape != actual.shape:
        raise ValueError(f"bins differ: {expected.shape} vs {actual.shape}")
    if expected.sum() <= 0 or actual.sum() <= 0:
        return float("nan")
    e = np.maximum(expected / expected.sum(), EMPTY_BIN_SHARE)
    a = np.maximum(actual / actual.sum(), EMPTY_BIN_SHARE)
    return float(np.sum((a - e) * np.log(a / e)))
