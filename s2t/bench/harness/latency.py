"""The latency figures of a run's calls, computed one way for every bench mode that times calls itself."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`th percentile (0-100) of `values`, interpolated as numpy does; NaN when there are none. The one
    percentile of the benchmark: every mode's latencies are read this way."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def percentile_or_none(values: Sequence[float], q: float) -> float | None:
    """`percentile`, None when nothing was timed (a report's null, where NaN is no JSON)."""
    return percentile(values, q) if len(values) else None


@dataclass(frozen=True)
class LatencySummary:
    """Milliseconds per call (percentiles interpolated as numpy does); NaN when no call was timed."""
    calls: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of_seconds(cls, durations_s: Sequence[float]) -> "LatencySummary":
        if len(durations_s) == 0:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        ms = np.asarray(durations_s, dtype=float) * 1000.0
        return cls(len(ms), float(ms.mean()), percentile(ms, 50), percentile(ms, 95), percentile(ms, 99))
