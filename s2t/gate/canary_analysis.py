"""Automated canary analysis on the model's outputs, from risk_router's metrics: the figures and the verdicts.

As Flagger or Argo Rollouts do for web services: a shadow step first (the candidate scores a mirrored sample of
live records; its answers are only compared with the primary's), then canary steps of rising share. After each
interval the candidate's figures over that interval (metric deltas) are held against the limits:

- shadow: mean |candidate - primary| on the same records (the +0.05 shift of a broken model shows at once);
- canary: the candidate's failed-row rate, the p99 of its scoring calls, and the PSI of its score distribution
  against the primary's over the same interval.

The first breach rolls the candidate back (the canary is aborted) and says why; clearing every step promotes it.
A step with too few candidate records to judge is extended, up to `max_extensions` times, then rolled back.
`s2t/control/auto_canary.py` drives the steps (`s2t canary MODEL N --auto`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from s2t.backends.routing.drift_watch import psi
from s2t.backends.routing.router_metrics import SCORE_BUCKETS, target_labels
from s2t.gate.canary_limits import Limits
from s2t.prometheus_text import Metrics


@dataclass(frozen=True)
class StepFigures:
    phase: str  # "shadow" or "canary"
    percent: float
    candidate_rows: int
    primary_rows: int
    failed_rows: int = 0
    p99_seconds: float | None = None
    psi: float | None = None
    shadow_mean_diff: float | None = None

    def line(self) -> str:
        parts = [f"{self.phase} {self.percent:g}%: {self.candidate_rows} candidate records"]
        if self.shadow_mean_diff is not None:
            parts.append(f"mean |diff| {self.shadow_mean_diff:.4f}")
        if self.phase == "canary":
            parts.append(f"failed {self.failed_rows}")
            if self.p99_seconds is not None:
                parts.append(f"p99 {self.p99_seconds * 1000:.0f} ms")
            parts.append(f"PSI {self.psi:.3f}" if self.psi is not None else "PSI not judged (too few records)")
        return ", ".join(parts)


@dataclass(frozen=True)
class Outcome:
    promoted: bool
    reason: str
    steps: tuple[StepFigures, ...]

    def line(self, version: int) -> str:
        return f"promoted {version}" if self.promoted else f"rolled back ({self.reason})"


def _value(metrics: Metrics, name: str, **labels) -> float:
    return metrics.get((name, frozenset(labels.items())), 0.0)


def _delta(before: Metrics, after: Metrics, name: str, **labels) -> float:
    return _value(after, name, **labels) - _value(before, name, **labels)


def _score_counts(before: Metrics, after: Metrics, served_by: str) -> list[float]:
    """Records per score bin (not cumulative) over the interval."""
    cumulative = [_delta(before, after, "s2t_router_score_bucket", **target_labels(served_by), le=f"{le:g}")
                  for le in SCORE_BUCKETS]
    return [c - p for c, p in zip(cumulative, [0.0, *cumulative[:-1]])]


def _p99(before: Metrics, after: Metrics, served_by: str) -> float | None:
    wanted = target_labels(served_by).items()
    buckets = sorted((float(dict(labels)["le"]), after[(name, labels)] - before.get((name, labels), 0.0))
                     for (name, labels) in after if name == "s2t_router_call_seconds_bucket"
                     and wanted <= labels and dict(labels)["le"] != "+Inf")
    total = _delta(before, after, "s2t_router_call_seconds_bucket", **target_labels(served_by), le="+Inf")
    if total <= 0:
        return None
    for le, count in buckets:
        if count >= 0.99 * total:
            return le
    return math.inf


def figures(before: Metrics, after: Metrics, phase: str, percent: float, primary: str, candidate: str
            ) -> StepFigures:
    if phase == "shadow":
        count = _delta(before, after, "s2t_router_shadow_abs_diff_count", **target_labels(candidate))
        total = _delta(before, after, "s2t_router_shadow_abs_diff_sum", **target_labels(candidate))
        return StepFigures(phase, percent, int(count), 0, shadow_mean_diff=total / count if count > 0 else None)
    candidate_counts = _score_counts(before, after, candidate)
    primary_counts = _score_counts(before, after, primary)
    rows, primary_rows = int(sum(candidate_counts)), int(sum(primary_counts))
    drift = psi(primary_counts, candidate_counts) if min(rows, primary_rows) > 0 else None
    return StepFigures(phase, percent, rows, primary_rows,
                       int(_delta(before, after, "s2t_router_failed_rows_total", **target_labels(candidate))),
                       _p99(before, after, candidate), drift)


def breaches(step: StepFigures, limits: Limits) -> list[str]:
    """What is over its limit; empty when the step passed. Assumes enough records (see `judgeable`)."""
    found = []
    if step.phase == "shadow":
        if step.shadow_mean_diff is not None and step.shadow_mean_diff > limits.max_shadow_mean_diff:
            found.append(f"shadow mean |candidate - primary| {step.shadow_mean_diff:.4f} > "
                         f"{limits.max_shadow_mean_diff:g}")
        return found
    attempted = step.candidate_rows + step.failed_rows
    if attempted and step.failed_rows / attempted > limits.max_error_rate:
        found.append(f"error rate {step.failed_rows / attempted:.3f} > {limits.max_error_rate:g}")
    if step.p99_seconds is not None and step.p99_seconds > limits.max_p99_seconds:
        found.append(f"p99 {step.p99_seconds * 1000:.0f} ms > {limits.max_p99_seconds * 1000:.0f} ms")
    if step.psi is not None and step.candidate_rows >= limits.min_psi_rows and step.psi > limits.max_psi:
        found.append(f"PSI of the candidate's scores vs the primary's {step.psi:.3f} > {limits.max_psi:g}")
    return found


def judgeable(step: StepFigures, limits: Limits) -> bool:
    return step.candidate_rows + step.failed_rows >= limits.min_rows


def parse_duration(text: str) -> float:
    """"60s", "2m", "500ms" or a number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        raise ValueError(f"duration {text!r}: expected a number with ms, s, m or h")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]
    return float(match.group(1)) * scale
