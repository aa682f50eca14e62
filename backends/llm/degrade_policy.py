"""When to answer with the light path (the template) instead of waiting for the language model.

A request degrades when the expected time to first token (a moving average of the recent ones) is over the
threshold, or when its own first token has not come within the threshold. While degraded, one request per
`probe_interval_s` still tries the model, so the estimate recovers when the model does.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from s2t.backends.llm.stream_timing import TtftEstimate

LLM = "llm"
EXPECTED_TTFT = "expected_ttft"
TTFT_TIMEOUT = "ttft_timeout"
LLM_ERROR = "llm_error"
DEGRADE_REASONS = (EXPECTED_TTFT, TTFT_TIMEOUT, LLM_ERROR)


@dataclass
class DegradePolicy:
    threshold_s: float = 1.0
    probe_interval_s: float = 5.0
    estimate: TtftEstimate = field(default_factory=TtftEstimate)
    _last_try: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        if not self.threshold_s >= 0 or not self.probe_interval_s > 0:
            raise ValueError(f"degrade_ttft_s must be >= 0 and probe_interval_s > 0, got {self.threshold_s}, "
                             f"{self.probe_interval_s}")

    def route(self, now: float) -> str:
        """LLM, or EXPECTED_TTFT when the model is expected to be too slow (and no probe is due)."""
        with self._lock:
            expected = self.estimate.value
            if expected is not None and expected > self.threshold_s and now - self._last_try < self.probe_interval_s:
                return EXPECTED_TTFT
            self._last_try = now
            return LLM

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.estimate.observe(seconds)

    def timed_out(self, waited_s: float) -> None:
        """The first token did not come within the threshold: at least `waited_s`."""
        with self._lock:
            self.estimate.observe(waited_s)
