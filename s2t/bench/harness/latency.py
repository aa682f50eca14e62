"""The latency figures of a run's calls, computed one way for every bench mode that times calls itself."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


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
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        return cls(len(ms), float(ms.mean()), float(p50), float(p95), float(p99))
