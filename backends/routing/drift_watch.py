"""Population stability index (PSI), and feature drift of live records against the training data.

PSI: how far one distribution over fixed bins has moved from another.

PSI = sum over bins of (actual% - expected%) * ln(actual% / expected%). Rules of thumb used in credit risk:
below 0.1 no shift, 0.1-0.25 a moderate one, above 0.25 (0.2 for single features in many shops) a significant one.

A PSI over a small sample is mostly sampling noise, so the drift monitor publishes a figure only with evidence:
- bins: a reference bin holding under MIN_BIN_SHARE of the training rows is pooled with the other rare ones, so
  that every bin can expect a few records; a bin the training data never filled (an unseen category, a score
  range the model never gave) stays apart, so that what is new is seen as new;
- minimum sample: a figure needs MIN_EXPECTED_PER_BIN records expected in its rarest (seen) bin, that is
  n >= MIN_EXPECTED_PER_BIN / smallest reference share (at most 5 / 0.025 = 200 records); below it the state is
  "not enough data" and nothing is flagged;
- noise: for two samples of the same distribution (n live, m reference records, k bins) PSI is close to
  chi-square(k - 1) * (1/n + 1/m), so the PSI that noise alone exceeds one time in a thousand is that quantile;
- drift: PSI over both that noise level and the alert level (0.2): significant and large enough to matter.
Counts are smoothed with half a record per bin (instead of a floor on the share), so that an empty bin adds a
bounded term that shrinks as the sample grows.
"""
from __future__ import annotations

import json
import math
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from s2t.backends.records.feature_spec import VOCABULARY

EMPTY_BIN_SHARE = 1e-4
PSEUDO_COUNT = 0.5
MIN_BIN_SHARE = 0.025
MIN_EXPECTED_PER_BIN = 5.0
# z of the one-sided 99.9% normal quantile: the noise level is exceeded by chance once in a thousand figures.
NOISE_Z = 3.090
ALERT_PSI = 0.2
TOP_BINS = 3

NOT_ENOUGH_DATA, NO_DRIFT, DRIFT = "not enough data", "ok", "drift"


def psi(expected_counts, actual_counts, pseudo_count: float | None = None) -> float:
    """PSI of `actual` against `expected`, both counts over the same bins; NaN when either side has no count.

    Without `pseudo_count` an empty bin's share is floored at EMPTY_BIN_SHARE; with it every bin gets that many
    extra records on both sides (the drift monitor's smoothing, see the module docstring)."""
    expected = np.asarray(expected_counts, dtype=np.float64)
    actual = np.asarray(actual_counts, dtype=np.float64)
    if expected.shape != actual.shape:
        raise ValueError(f"bins differ: {expected.shape} vs {actual.shape}")
    if expected.sum() <= 0 or actual.sum() <= 0:
        return float("nan")
    if pseudo_count is None:
        e = np.maximum(expected / expected.sum(), EMPTY_BIN_SHARE)
        a = np.maximum(actual / actual.sum(), EMPTY_BIN_SHARE)
    else:
        e = (expected + pseudo_count) / (expected.sum() + pseudo_count * len(expected))
        a = (actual + pseudo_count) / (actual.sum() + pseudo_count * len(actual))
    return float(np.sum((a - e) * np.log(a / e)))


def chi_square_quantile(dof: int, z: float = NOISE_Z) -> float:
    """Wilson-Hilferty: the chi-square quantile whose normal z is `z` (within about 1% from 3 degrees of freedom)."""
    if dof <= 0:
        return 0.0
    c = 2.0 / (9.0 * dof)
    return dof * max(0.0, 1.0 - c + z * math.sqrt(c)) ** 3


def noise_psi(dof: int, sample: int, reference_rows: float) -> float:
    """The PSI that two samples of one distribution (`sample` and `reference_rows` records) exceed by chance
    once in a thousand (see the module docstring)."""
    if sample <= 0 or reference_rows <= 0:
        return float("inf")
    return chi_square_quantile(dof) * (1.0 / sample + 1.0 / reference_rows)


SCORE_FEATURE = "score"
SCORE_EDGES = tuple(round(0.1 * i, 1) for i in range(1, 10))  # ten equal-width score bins


@dataclass(frozen=True)
class Reference:
    """Training-data counts per bin: categorical features by vocabulary index (0 = out of vocabulary), numeric
    features, int64 and hashed categorical ones (kept with the numeric bins) and the score by bin edges (a value goes to
    the first bin whose upper edge is >= it, the last bin
    takes the rest). `source` says what the counts were taken from (data, and the model that gave the scores)."""

    categorical: dict[str, np.ndarray]  # name -> counts per index
    numeric_edges: dict[str, np.ndarray]
    numeric: dict[str, np.ndarray]  # name -> counts per bin (len(edges) + 1)
    score: np.ndarray  # counts per score bin (len(SCORE_EDGES) + 1)
    source: str = ""

    @classmethod
    def build(cls, spec, categorical: np.ndarray, numeric: np.ndarray, scores: np.ndarray,
              numeric_bins: int = 10, source: str = "") -> "Reference":
        cat, edges, counts = {}, {}, {}
        for i, feature in enumerate(spec.categorical):
            if _by_index(feature):
                cat[feature.name] = np.bincount(categorical[:, i], minlength=max(feature.vocabulary.values(),
                                                                                 default=0) + 1).astype(np.float64)
            else:
                # An int64 feature (any value, negative or up to 2^63), a hash bucket (up to 2^63 of them) or a
                # table's own values: a count per value would size the array by the values (and refuse negative
                # ones), so it is binned by quantiles as a number.
                edges[feature.name], counts[feature.name] = _quantile_bins(categorical[:, i], numeric_bins)
        for i, name in enumerate(spec.numeric):
            edges[name], counts[name] = _quantile_bins(numeric[:, i], numeric_bins)
        return cls(cat, edges, counts, _bin_counts(np.asarray(scores, np.float64).ravel(), np.array(SCORE_EDGES)),
                   source)

    def to_json(self) -> str:
        return json.dumps({"categorical": {k: v.tolist() for k, v in self.categorical.items()},
                           "numeric_edges": {k: v.tolist() for k, v in self.numeric_edges.items()},
                           "numeric": {k: v.tolist() for k, v in self.numeric.items()},
                           "score": self.score.tolist(), "source": self.source}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Reference":
        raw = json.loads(text)
        return cls({k: np.asarray(v, np.float64) for k, v in raw["categorical"].items()},
                   {k: np.asarray(v, np.float64) for k, v in raw["numeric_edges"].items()},
                   {k: np.asarray(v, np.float64) for k, v in raw["numeric"].items()},
                   np.asarray(raw["score"], np.float64), str(raw.get("source", "")))


# The largest vocabulary index counted per index; a table that maps its keys to larger values (or to negative ones:
# a StaticHashTable's default of -1) is binned as numbers, like int64 values and hash buckets.
MAX_COUNTED_INDEX = 4096


def _by_index(feature) -> bool:
    """A feature counted per vocabulary index (small, not negative); the others are binned as numbers."""
    if getattr(feature, "kind", VOCABULARY) != VOCABULARY:
        return False
    indices = [*feature.vocabulary.values(), feature.default_index]
    return 0 <= min(indices) and max(indices) <= MAX_COUNTED_INDEX


def _quantile_bins(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Decile edges of the training values (fewer where values repeat, e.g. small integer counts), and the counts."""
    column = np.asarray(values).astype(np.float64)
    inner = np.unique(np.quantile(column, np.linspace(0, 1, bins + 1)[1:-1]))
    return inner, _bin_counts(column, inner)


def _bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges) + 1).astype(np.float64)


def range_labels(edges: Sequence[float]) -> list[str]:
    """Bin labels for edges as binned by `_bin_counts`: `<= a`, `(a, b]`, ..., `> z`."""
    edges = [f"{e:g}" for e in edges]
    if not edges:
        return ["all"]
    return [f"<= {edges[0]}"] + [f"({a}, {b}]" for a, b in zip(edges, edges[1:])] + [f"> {edges[-1]}"]


@dataclass(frozen=True)
class BinPlan:
    """How one series' reference bins are grouped for drift: `merge[raw bin]` is the drift bin."""

    merge: np.ndarray
    labels: tuple[str, ...]
    reference: np.ndarray  # training counts per drift bin
    raw_labels: tuple[str, ...] = ()
    raw_reference: np.ndarray | None = None  # training counts per reference bin

    @classmethod
    def of(cls, raw_counts: np.ndarray, raw_labels: Sequence[str], min_share: float = MIN_BIN_SHARE) -> "BinPlan":
        counts = np.asarray(raw_counts, np.float64)
        share = counts / counts.sum()
        rare = [i for i in range(len(counts)) if 0 < share[i] < min_share]
        groups = [[i] for i in range(len(counts)) if i not in rare]
        if rare:
            if share[rare].sum() < min_share:
                seen = [g for g in groups if share[g].sum() > 0]
                if seen:
                    smallest = min(seen, key=lambda g: share[g].sum())
                    groups.remove(smallest)
                    rare = sorted(rare + smallest)
            groups.append(rare)
        groups.sort()
        merge = np.empty(len(counts), np.int64)
        for j, group in enumerate(groups):
            merge[group] = j
        labels = tuple(" | ".join(raw_labels[i] for i in group) for group in groups)
        return cls(merge, labels, np.bincount(merge, weights=counts, minlength=len(groups)), tuple(raw_labels), counts)

    @property
    def seen(self) -> np.ndarray:
        return self.reference > 0

    @property
    def min_sample(self) -> int:
        """Records needed for MIN_EXPECTED_PER_BIN in the rarest bin the training data filled."""
        smallest = self.reference[self.seen].min() / self.reference.sum()
        return math.ceil(MIN_EXPECTED_PER_BIN / smallest - 1e-9)

    @property
    def dof(self) -> int:
        return int(self.seen.sum()) - 1


@dataclass(frozen=True)
class MovedBin:
    label: str
    reference_share: float
    live_share: float


@dataclass(frozen=True)
class Figure:
    """One series' drift over the window: PSI, the sample it is over, and the noise level at that sample."""

    psi: float
    sample: int
    min_sample: int
    noise_psi: float
    alert_psi: float
    top_bins: tuple[MovedBin, ...]
    live_shares: tuple[float, ...] = ()  # per reference bin (before pooling), in the plan's raw order
    sampled: int = 0  # records sampled since the monitor started, the window's and older ones

    @property
    def state(self) -> str:
        if self.sample < self.min_sample:
            return NOT_ENOUGH_DATA
        return DRIFT if self.psi > max(self.alert_psi, self.noise_psi) else NO_DRIFT

    @property
    def drifted(self) -> bool:
        return self.state == DRIFT


def plans_of(reference: Reference, spec) -> dict[str, BinPlan]:
    """Drift bins per series (categorical features, numeric features, the score), labelled for people."""
    plans = {}
    for feature in spec.categorical:
        if not _by_index(feature):
            if feature.name not in reference.numeric_edges:
                raise ValueError(f"the drift reference has no bins for the {feature.kind} feature {feature.name!r} "
                                 "(it counted it per value): build the reference again")
            plans[feature.name] = BinPlan.of(reference.numeric[feature.name],
                                             range_labels(reference.numeric_edges[feature.name]))
            continue
        counts = reference.categorical[feature.name]
        names = {index: value for value, index in feature.vocabulary.items()}
        plans[feature.name] = BinPlan.of(counts, [names.get(i, "(unseen category)") for i in range(len(counts))])
    for name in spec.numeric:
        plans[name] = BinPlan.of(reference.numeric[name], range_labels(reference.numeric_edges[name]))
    plans[SCORE_FEATURE] = BinPlan.of(reference.score, range_labels(SCORE_EDGES))
    return plans


def _padded_edges(edges: Sequence[np.ndarray]) -> np.ndarray:
    """Edges of several series padded with +inf to one width: a value's bin is the number of its series' edges
    below it, as np.searchsorted(side="left") gives it, for all series in one comparison."""
    padded = np.full((len(edges), max((len(e) for e in edges), default=0)), np.inf)
    for i, series in enumerate(edges):
        padded[i, :len(series)] = series
    return padded


class DriftMonitor:
    """The bins of the last `window_records` sampled records, against the reference, in fixed memory.

    Every `1 / sample_rate`-th record is sampled (a stride, so the cost is one slice per batch). The window is a
    ring of reference-bin indices, one row per sampled record; its counts are kept as records enter and leave, so a
    figure is a sum over a few bins (pooled into the drift bins for the PSI). A record's score is counted only where
    it is finite (the caller gives NaN for a score that does not belong to the reference's version).
    """

    def __init__(self, reference: Reference, spec, window_records: int = 2000, sample_rate: float = 1.0,
                 alert_psi: float = ALERT_PSI):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"drift sample rate must be within (0, 1], got {sample_rate}")
        if window_records < 1:
            raise ValueError(f"drift window must hold at least one record, got {window_records}")
        self.reference, self.window_records, self.alert_psi = reference, window_records, alert_psi
        self.plans = plans_of(reference, spec)
        self._names = tuple(self.plans)
        self._categorical_order = tuple(f.name for f in spec.categorical)
        self._numeric_order = tuple(spec.numeric)
        self._stride, self._offset = max(1, round(1 / sample_rate)), 0
        self._rows = np.full((window_records, len(self._names)), -1, np.int16)
        self._next = 0
        # One flat array of counts for every series (one bincount per batch), `_counts` its per-series views.
        sizes = [len(self.plans[n].merge) for n in self._names]
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._flat = np.zeros(sum(sizes))
        self._counts = np.split(self._flat, np.cumsum(sizes)[:-1])
        self._largest_index = np.array([len(self.plans[n].merge) - 1 for n in self._categorical_order])
        # Categorical columns binned by edges (int64 values, hash buckets), with their edges padded with +inf.
        binned = [(i, f.name) for i, f in enumerate(spec.categorical) if not _by_index(f)]
        self._binned = np.array([i for i, _ in binned], np.int64)
        self._binned_edges = _padded_edges([self.reference.numeric_edges[name] for _, name in binned])
        # Edges padded with +inf to one width: a record's bin is the number of its feature's edges below the value,
        # as np.searchsorted(side="left") gives it, for all numeric features in one comparison.
        self._edges = _padded_edges([self.reference.numeric_edges[n] for n in self._numeric_order])
        self.sampled = 0

    def observe(self, categorical: np.ndarray, numeric: np.ndarray, scores: np.ndarray) -> None:
        """Rows of one batch (decoded records and their scores); only the sampled stride is counted."""
        rows = np.arange(self._offset, len(scores), self._stride)
        self._offset = (self._offset - len(scores)) % self._stride
        if not len(rows):
            return
        self.sampled += len(rows)
        rows = rows[-self.window_records:]  # a batch larger than the window: only its last records stay
        bins = np.empty((len(rows), len(self._names)), np.int16)
        n_categorical = len(self._categorical_order)
        bins[:, :n_categorical] = np.clip(categorical[rows, :n_categorical], 0, self._largest_index)
        if len(self._binned):
            values = categorical[rows][:, self._binned].astype(np.float64)
            bins[:, self._binned] = (values[:, :, None] > self._binned_edges[None]).sum(axis=2)
        values = numeric[rows, :len(self._numeric_order)].astype(np.float64)
        bins[:, n_categorical:-1] = (values[:, :, None] > self._edges[None]).sum(axis=2)
        score = np.asarray(scores, np.float64).ravel()[rows]
        finite = np.isfinite(score)
        raw = np.searchsorted(np.array(SCORE_EDGES), np.where(finite, score, 0.0), side="left")
        bins[:, -1] = np.where(finite, raw, -1)
        self._enter(bins)

    def _enter(self, bins: np.ndarray) -> None:
        slots = (self._next + np.arange(len(bins))) % self.window_records
        leaving = self._rows[slots]
        for rows, sign in ((leaving, -1.0), (bins, 1.0)):
            flat = rows + self._starts
            self._flat += sign * np.bincount(flat[rows >= 0], minlength=len(self._flat))
        self._rows[slots] = bins
        self._next = (self._next + len(bins)) % self.window_records

    def figures(self) -> dict[str, Figure]:
        """Each series' figure over the window (see the module docstring for the rule)."""
        out = {}
        for name, raw_counts in zip(self._names, self._counts):
            plan = self.plans[name]
            counts = np.bincount(plan.merge, weights=raw_counts, minlength=len(plan.reference))
            sample = int(round(raw_counts.sum()))
            live = raw_counts / sample if sample else np.zeros_like(raw_counts)
            expected = plan.raw_reference / plan.raw_reference.sum()
            moved = np.argsort(-np.abs(live - expected), kind="stable")[:TOP_BINS]
            out[name] = Figure(psi(plan.reference, counts, PSEUDO_COUNT), sample, plan.min_sample,
                               noise_psi(plan.dof, sample, plan.reference.sum()), self.alert_psi,
                               tuple(MovedBin(plan.raw_labels[b], float(expected[b]), float(live[b])) for b in moved),
                               tuple(float(x) for x in live), self.sampled)
        return out


class DriftWatch:
    """A monitor fed with every scored batch, its figures published when new records came in and the last
    publication is at least `publish_seconds` old: on traffic, and on a timer (`start`) so that a burst's last
    records reach the gauges once traffic stops. Scores of rows not answered by `score_source` (the version the
    score reference belongs to) are not counted. Monitoring never fails an answer: the first error is logged and
    watching stops."""

    def __init__(self, monitor: DriftMonitor, publish: Callable[[dict[str, Figure]], None], publish_seconds: float,
                 log: Callable[[str], None], score_source: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.monitor, self._publish, self._every, self._log, self._clock = monitor, publish, publish_seconds, log, clock
        self._score_source = score_source
        self._published_at = -float("inf")
        self._dirty = True  # the first tick publishes the empty window: "not enough data" rather than no series
        self._lock = threading.Lock()
        self._publishing = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def __call__(self, categorical: np.ndarray, numeric: np.ndarray, probability: np.ndarray,
                 served_by: Sequence[str | None] | None = None) -> None:
        if self.monitor is None or not len(probability):
            return
        scores = np.asarray(probability, np.float64).reshape(-1).copy()
        if self._score_source is not None and served_by is not None:
            scores[[s != self._score_source for s in served_by]] = np.nan
        with self._lock:
            self._guarded(self.monitor.observe, categorical, numeric, scores)
            self._dirty = True
        self.tick()

    def tick(self) -> None:
        # One publication at a time: handing the gauges over can outlast the interval on a loaded machine, and a
        # second one beside it could leave the older figures last. A tick that finds one running returns (a batch
        # never waits); what it would have published stays new for the next tick.
        if not self._publishing.acquire(blocking=False):
            return
        try:
            with self._lock:
                if self.monitor is None or not self._dirty or self._clock() - self._published_at < self._every:
                    return
                self._published_at, self._dirty = self._clock(), False
                figures = self._guarded(self.monitor.figures)
            # Outside the lock: handing the gauges over is one message each, and a batch must not wait for them.
            if figures is not None:
                self._guarded(self._publish, figures)
        finally:
            self._publishing.release()

    def _guarded(self, action, *args):
        if self.monitor is None:
            return None
        try:
            return action(*args)
        except Exception:  # noqa: BLE001 - see the class docstring
            self._log("drift monitoring stopped:\n" + traceback.format_exc())
            self.monitor = None
            return None

    def start(self) -> None:
        """Tick on a timer, four times per publish interval, until `stop`."""
        def run():
            while not self._stop.wait(self._every / 4):
                self.tick()
        self._timer = threading.Thread(target=run, name="drift-publish", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=5)


def choose_reference(repository: Path, model: str, version: int | None, training: Path, filename: str) -> Path | None:
    """The served version's own reference (`repository/model/version/filename`), else the training reference."""
    if version is not None:
        own = Path(repository) / model / str(version) / filename
        if own.is_file():
            return own
    return training if training.is_file() else None

