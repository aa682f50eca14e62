"""Circuit breaker for the primary scorer: open on error rate or p99 over a sliding window, probe, recover.

CLOSED: everything goes to the primary; outcomes are kept for `window_seconds`. When at least `min_requests`
outcomes show an error rate over `max_error_rate` or a p99 latency over `max_p99_seconds`, the breaker OPENs:
callers use the fallback for `open_seconds`, then one probe batch goes to the primary (HALF_OPEN). A good probe
closes the breaker with a fresh window; a bad one opens it again.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from s2t.backends.runtime.model_parameters import parameter, seconds_from_ms

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class BreakerSettings:
    window_seconds: float = parameter("breaker_window_seconds", 5.0)
    max_error_rate: float = parameter("breaker_max_error_rate", 0.10)
    max_p99_seconds: float = parameter("breaker_max_p99_ms", 1.0, parse=seconds_from_ms)
    min_requests: int = parameter("breaker_min_requests", 20)
    open_seconds: float = parameter("breaker_open_seconds", 2.0)

    def __post_init__(self):
        if self.window_seconds <= 0 or self.open_seconds <= 0 or self.max_p99_seconds <= 0:
            raise ValueError("breaker window, open time and p99 limit must be positive")
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError(f"breaker error rate must be within 0..1, got {self.max_error_rate}")
        if self.min_requests < 1:
            raise ValueError("breaker min_requests must be >= 1")


# Re-evaluating the window on every batch would sort it hundreds of times a second; this often is enough.
EVALUATE_EVERY_SECONDS = 0.1


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        # One entry per call to the primary: (time, ok, latency, rows).
        self._outcomes: deque[tuple[float, bool, float, int]] = deque()
        self.state = CLOSED
        self._opened_at = 0.0
        self._evaluated_at = -math.inf
        self._probing = False

    def allow(self) -> bool:
        """May the next batch go to the primary? In HALF_OPEN only one probe is out at a time."""
        if self.state == OPEN and self._clock() - self._opened_at >= self.settings.open_seconds:
            self.state, self._probing = HALF_OPEN, False
        if self.state == CLOSED:
            return True
        if self.state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def record(self, ok: bool, latency_seconds: float, rows: int = 1) -> None:
        now = self._clock()
        if self.state == HALF_OPEN:
            if ok and latency_seconds <= self.settings.max_p99_seconds:
                self.state = CLOSED
                self._outcomes.clear()
            else:
                self._open(now)
            self._probing = False
            return
        if self.state == OPEN:
            return
        self._outcomes.append((now, ok, latency_seconds, rows))
        horizon = now - self.settings.window_seconds
        while self._outcomes and self._outcomes[0][0] < horizon:
            self._outcomes.popleft()
        if not ok or now - self._evaluated_at >= EVALUATE_EVERY_SECONDS:
            self._evaluated_at = now
            if self._tripped():
                self._open(now)

    def _tripped(self) -> bool:
        total = sum(rows for *_, rows in self._outcomes)
        if total < self.settings.min_requests:
            return False
        errors = sum(rows for _, ok, _, rows in self._outcomes if not ok)
        if errors / total > self.settings.max_error_rate:
            return True
        # p99 over rows: each row waited as long as the call that carried it.
        answered = sorted((lat, rows) for _, ok, lat, rows in self._outcomes if ok)
        threshold, seen = 0.99 * sum(rows for _, rows in answered), 0
        for latency, rows in answered:
            seen += rows
            if seen >= threshold:
                return latency > self.settings.max_p99_seconds
        return False

    def _open(self, now: float) -> None:
        self.state, self._opened_at = OPEN, now
        self._outcomes.clear()
