"""Timing of token streams: time to first token, inter-token latency, and tokens per second over a window."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

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


@dataclass
class PendingTokens:
    """A stream's token count and inter-token gaps not yet sent to Triton's metrics."""

    tokens: int = 0
    gaps: list[float] = field(default_factory=list)


OUTCOMES = ("completed", "cancelled", "invalid", "refused", "failed")


class LlmMetrics:
    """`s2t_llm_*` for one model instance; `metric_family` is Triton's pb_utils.MetricFamily (handed in, so this
    module imports nothing from Triton). Updated from the model's outbox thread only."""

    def __init__(self, metric_family, labels: dict[str, str], clock: Callable[[], float] = time.monotonic):
        family = metric_family
        # The families must outlive their metrics (Triton refuses updates once a family is collected).
        self._families = {
            "tokens": family("s2t_llm_tokens_total", "tokens generated", family.COUNTER),
            "requests": family("s2t_llm_requests_total", "generation requests by outcome", family.COUNTER),
            "rate": family("s2t_llm_tokens_per_second", "tokens generated per second, last 10 s", family.GAUGE),
            "queue": family("s2t_llm_queue_depth", "requests waiting for a slot", family.GAUGE),
            "active": family("s2t_llm_active_slots", "requests generating", family.GAUGE),
            "ttft": family("s2t_llm_time_to_first_token_seconds", "from arrival to the first token",
                           family.HISTOGRAM),
            "itl": family("s2t_llm_inter_token_latency_seconds", "between two tokens of one stream",
                          family.HISTOGRAM),
        }
        self._tokens = self._families["tokens"].Metric(labels=labels)
        self._requests = {outcome: self._families["requests"].Metric(labels={**labels, "outcome": outcome})
                          for outcome in OUTCOMES}
        self._rate_gauge = self._families["rate"].Metric(labels=labels)
        self._queue_gauge = self._families["queue"].Metric(labels=labels)
        self._active_gauge = self._families["active"].Metric(labels=labels)
        self._ttft = self._families["ttft"].Metric(labels=labels, buckets=list(TTFT_BUCKETS))
        self._itl = self._families["itl"].Metric(labels=labels, buckets=list(ITL_BUCKETS))
        self._rate, self._clock = TokenRate(), clock

    def token(self, timing: StreamTiming, now: float, pending: "PendingTokens | None" = None) -> None:
        """One token of a stream. Its time to first token is observed at once; with `pending`, the token count and
        inter-token gap are kept there and reach Triton with `flush` (each update is a round trip to the server
        process, on the thread that sends every stream's tokens)."""
        ttft, itl = timing.token(now)
        if ttft is not None:
            self._ttft.observe(ttft)
        self._rate.add(now)
        if pending is None:
            if itl is not None:
                self._itl.observe(itl)
            self._tokens.increment(1)
            return
        pending.tokens += 1
        if itl is not None:
            pending.gaps.append(itl)

    def flush(self, pending: "PendingTokens") -> None:
        for gap in pending.gaps:
            self._itl.observe(gap)
        if pending.tokens:
            self._tokens.increment(pending.tokens)
        pending.tokens, pending.gaps = 0, []

    def request(self, outcome: str) -> None:
        self._requests[outcome].increment(1)

    def engine(self, queue_depth: int, active: int) -> None:
        self._rate_gauge.set(self._rate.rate(self._clock()))
        self._queue_gauge.set(queue_depth)
        self._active_gauge.set(active)
