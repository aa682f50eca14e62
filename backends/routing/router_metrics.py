"""risk_router's Prometheus metrics, through the MetricFamily class Triton's python backend provides.

The class is passed in, so this module has no Triton import. Every series about a scorer names it with two labels,
`model` and `version` (empty where a target names no version), so queries can group by either.

Shadow differences are a Triton histogram (`MetricFamily.HISTOGRAM`, one observation per mirrored record: the
shadow is a sample). Scores and call durations, observed for every record, are histograms built from counters
(`_bucket{le=…}` only), counted here and handed to Triton once a second: one observation is one message from the
stub to the server, and one per record would cost the router more than its scoring call.

Records whose caller forced the route are counted in `s2t_router_rows_total` and `s2t_router_forced_rows_total`
only: the score and call histograms and the failed rows describe the router's own split, which the canary analysis
judges, and a caller choosing its version must not move that judgement. Labels come from versions that answered
(the router refuses a route to any other), so the label set is bounded by what is loaded.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

import numpy as np

from s2t.backends.routing.circuit_breaker import CLOSED, HALF_OPEN, OPEN
from s2t.backends.routing.router_core import BatchAnswer

SHADOW_BUCKETS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# Score histogram per model:version (the canary analysis compares the candidate's with the primary's, as PSI).
SCORE_BUCKETS = tuple(round(0.1 * i, 1) for i in range(1, 11))
CALL_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FLUSH_SECONDS = 1.0


def target_labels(target: str) -> dict[str, str]:
    """`risk_scorer:3` -> {"model": "risk_scorer", "version": "3"}; a target without a version gets version ""."""
    model, _, version = target.partition(":")
    return {"model": model, "version": version}


class RouterMetrics:
    def __init__(self, metric_family, clock: Callable[[], float] = time.monotonic):
        counter, gauge = metric_family.COUNTER, metric_family.GAUGE
        self._rows = metric_family(name="s2t_router_rows_total", description="Records answered, by model and version",
                                   kind=counter)
        self._fallback = metric_family(name="s2t_router_fallback_rows_total", kind=counter,
                                       description="Records the fallback answered for the primary")
        self._breaker = metric_family(name="s2t_router_breaker_state", kind=gauge,
                                      description="1 for the breaker's current state (closed, open, half_open)")
        self._shadow = metric_family(name="s2t_router_shadow_abs_diff", kind=metric_family.HISTOGRAM,
                                     description="|candidate - primary| per mirrored record, by the candidate's "
                                                 "model and version")
        self._score_bucket = metric_family(name="s2t_router_score_bucket", kind=counter,
                                           description="Records answered with probability <= le, by model and version")
        self._call_bucket = metric_family(name="s2t_router_call_seconds_bucket", kind=counter,
                                          description="Scoring calls that took <= le seconds, by model and version")
        self._forced = metric_family(name="s2t_router_forced_rows_total", kind=counter,
                                     description="Records answered on a route their caller forced, by model and "
                                                 "version (also in s2t_router_rows_total)")
        self._failed = metric_family(name="s2t_router_failed_rows_total", kind=counter,
                                     description="Records whose scoring call failed, by the model and version routed to")
        self._metrics: dict[tuple, object] = {}
        self._pending: dict[tuple, int] = defaultdict(int)
        self._clock, self._flushed_at = clock, clock()
        self._fallback_metric = self._fallback.Metric(labels={})
        self._states = {state: self._breaker.Metric(labels={"state": state}) for state in (CLOSED, OPEN, HALF_OPEN)}

    def _metric(self, family, buckets=None, **labels):
        key = (id(family), tuple(sorted(labels.items())))
        if key not in self._metrics:
            self._metrics[key] = (family.Metric(labels=labels) if buckets is None
                                  else family.Metric(labels=labels, buckets=list(buckets)))
        return self._metrics[key]

    def observe(self, answer: BatchAnswer, breaker_state: str) -> None:
        served, counts = np.unique([s for s in answer.served_by if s], return_counts=True)
        for name, count in zip(served, counts):
            self._metric(self._rows, **target_labels(str(name))).increment(int(count))
        forced = np.asarray(answer.forced or [False] * len(answer.served_by), dtype=bool)
        routed_by_router = np.array([bool(s) for s in answer.served_by], dtype=bool) & ~forced
        forced_served, forced_counts = np.unique([s for s, f in zip(answer.served_by, forced) if s and f],
                                                 return_counts=True)
        for name, count in zip(forced_served, forced_counts):
            self._metric(self._forced, **target_labels(str(name))).increment(int(count))
        if answer.fallback_rows:
            self._fallback_metric.increment(answer.fallback_rows)
        for state, metric in self._states.items():
            metric.set(1.0 if state == breaker_state else 0.0)
        for name in served:
            scores = answer.probability.ravel()[routed_by_router & np.array([s == name for s in answer.served_by])]
            if len(scores):
                self._histogram(self._score_bucket, SCORE_BUCKETS, scores, **target_labels(str(name)))
        for name, seconds in answer.call_seconds.items():
            self._histogram(self._call_bucket, CALL_SECONDS_BUCKETS, np.asarray(seconds), **target_labels(name))
        for target, rows in answer.failed_rows.items():
            self._metric(self._failed, **target_labels(target)).increment(rows)
        self._flush_if_due()
        for candidate, diffs in answer.shadow_differences.items():
            metric = self._metric(self._shadow, buckets=SHADOW_BUCKETS, **target_labels(candidate))
            for diff in diffs.ravel():
                metric.observe(float(diff))

    def _histogram(self, family, buckets, values: np.ndarray, **labels) -> None:
        """Counted here and handed to Triton at most every FLUSH_SECONDS (see the module's docstring)."""
        for le in buckets:
            self._pending[(family, (("le", f"{le:g}"), *sorted(labels.items())))] += int(np.count_nonzero(values <= le))
        self._pending[(family, (("le", "+Inf"), *sorted(labels.items())))] += len(values)

    def _flush_if_due(self) -> None:
        now = self._clock()
        if now - self._flushed_at < FLUSH_SECONDS:
            return
        self._flushed_at = now
        for (family, labels), count in self._pending.items():
            if count:
                self._metric(family, **dict(labels)).increment(count)
        self._pending.clear()


class DriftMetrics:
    """risk_router's drift figures, one series per feature (and `score`), bounded by the reference's bins:

    - `s2t_feature_psi`: PSI of the window against the reference; NaN while the window holds fewer records than
      the feature's minimum sample ("not enough data": no comparison with NaN is true, so no alert fires);
    - `s2t_feature_psi_noise`: the PSI sampling noise alone exceeds once in a thousand at this sample size;
    - `s2t_feature_drift_sample` / `s2t_feature_drift_min_sample`: records in the window, and the minimum;
    - `s2t_feature_drifted`: 1 where the PSI is over both the noise level and the alert level, else 0;
    - `s2t_feature_bin_share{feature, bin, side="live"|"reference"}`: each reference bin's share (before rare bins
      are pooled, so that the labels stay the same from one reference to the next), for what moved;
    - `s2t_feature_drift_window_records`: the window's size;
    - `s2t_feature_drift_reference_version`: the primary version whose own reference is compared with, 0 for the
      training reference (a number, not a label: a label per version would add a series at every promotion);
    - `s2t_feature_drift_sampled_records`: records sampled since the router started (the figures are up to date
      once it counts every record sent).
    """

    def __init__(self, metric_family, plans: dict, window_records: int, reference_version: int):
        gauge = metric_family.GAUGE
        # The families must outlive their metrics (Triton refuses to set a metric whose family was collected).
        self._families = {name: metric_family(name=name, kind=gauge, description=description) for name, description in (
            ("s2t_feature_psi", "PSI of the drift window against the reference, per feature (and score); NaN "
                                "while the window is under the minimum sample"),
            ("s2t_feature_psi_noise", "PSI that sampling noise alone exceeds once in a thousand at this sample"),
            ("s2t_feature_drift_sample", "Records in the drift window, per feature (and score)"),
            ("s2t_feature_drift_min_sample", "Records a figure needs before it is published"),
            ("s2t_feature_drifted", "1 where PSI is over both its noise level and the alert level"),
            ("s2t_feature_bin_share", "Share of each reference bin, live window or reference"),
            ("s2t_feature_drift_window_records", "Records the drift window holds at most"),
            ("s2t_feature_drift_reference_version", "Version whose own drift reference is in use, 0: the training "
                                                    "reference"),
            ("s2t_feature_drift_sampled_records", "Records the drift monitor sampled since it started"))}
        self._series = {(family, name): self._families[family].Metric(labels={"feature": name})
                        for family in ("s2t_feature_psi", "s2t_feature_psi_noise", "s2t_feature_drift_sample",
                                       "s2t_feature_drift_min_sample", "s2t_feature_drifted") for name in plans}
        share = self._families["s2t_feature_bin_share"]
        self._live, self._reference = {}, []  # held: a metric that is collected leaves the registry
        for name, plan in plans.items():
            for b, label in enumerate(plan.raw_labels):
                self._live[(name, b)] = share.Metric(labels={"feature": name, "bin": label, "side": "live"})
                self._reference.append(share.Metric(labels={"feature": name, "bin": label, "side": "reference"}))
                self._reference[-1].set(float(plan.raw_reference[b] / plan.raw_reference.sum()))
            self._series[("s2t_feature_drift_min_sample", name)].set(float(plan.min_sample))
            for family in ("s2t_feature_psi", "s2t_feature_psi_noise"):  # not enough data until the first figures
                self._series[(family, name)].set(float("nan"))
        self._window = self._families["s2t_feature_drift_window_records"].Metric(labels={})
        self._window.set(float(window_records))
        self._reference_version = self._families["s2t_feature_drift_reference_version"].Metric(labels={})
        self._reference_version.set(float(reference_version))
        self._sampled = self._families["s2t_feature_drift_sampled_records"].Metric(labels={})

    def publish(self, figures: dict) -> None:
        for name, figure in figures.items():
            enough = figure.sample >= figure.min_sample
            self._series[("s2t_feature_psi", name)].set(float(figure.psi) if enough else float("nan"))
            self._series[("s2t_feature_psi_noise", name)].set(float(figure.noise_psi) if enough else float("nan"))
            self._series[("s2t_feature_drift_sample", name)].set(float(figure.sample))
            self._series[("s2t_feature_drifted", name)].set(1.0 if figure.drifted else 0.0)
            for b, share in enumerate(figure.live_shares):
                self._live[(name, b)].set(float(share))
        # Last: Triton's metrics page can be read between two of these gauges, and whoever reads this publication's
        # count takes the figures as covering those records.
        self._sampled.set(float(max((figure.sampled for figure in figures.values()), default=0)))
