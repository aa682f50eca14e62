"""Timing of token streams: time to first token, inter-token latency, and tokens per second over a window."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Seconds. TTFT spans a short prompt on an idle engine (~0.05 s) to long prompts queued behind others (~10 s).
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Decoding one token takes ~18 ms alone on one core here; batching and contention stretch it.
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)


@dataclass
class StreamTiming:
    """One request's token times, in seconds on a monotonic clock."""

    started: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0

    def token(self, now: float) -> tuple[float | None, float | None]:
        """Record a token; returns (time to first token, inter-token latency), each None when not applicable."""
        self.tokens += 1
        if self.first_token is None:
            self.first_token = self.last_token = now
            return now - self.started, None
        gap = now - self.last_token
        self.last_token = now
        return None, gap


@dataclass
class TokenRate:
    """Tokens generated per second, all streams together, over the last `window_s` seconds."""

    window_s: float = 10.0
    _events: deque = field(default_factory=deque)
    _count: int = 0

    def add(self, now: float, tokens: int = 1) -> None:
        self._events.append((now, tokens))
        self._count += tokens
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        return self._count / self.window_s

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._count -= self._events.popleft()[1]


@dataclass
class TtftEstimate:
    """Expected time to first token: a moving average of the recent ones (None until one is seen)."""

    weight: float = 0.3
    value: float | None = None

    def observe(self, seconds: float) -> None:
        self.value = seconds if self.value is None else (1 - self.weight) * self.value + self.weight * seconds
