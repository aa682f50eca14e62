"""Population stability index (PSI), and feature drift of live records against the training data.

PSI: how far one distribution over fixed bins has moved from another.

PSI = sum over bins of (actual% - expected%) * ln(actual% / expected%). Rules of thumb used in credit risk:
below 0.1 no shift, 0.1-0.25 a moderate one, above 0.25 (0.2 for single features in many shops) a significant one.
Empty bins get a small floor so that a bin seen on one side only counts as a large, finite shift.
"""
from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass
from typing import Callable

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


SCORE_FEATURE = "score"
SCORE_EDGES = tuple(round(0.1 * i, 1) for i in range(1, 10))  # ten equal-width score bins


@dataclass(frozen=True)
class Reference:
    """Training-data counts per bin: categorical features by vocabulary index (0 = out of vocabulary), numeric
    features and the score by bin edges (a value goes to the first bin whose upper edge is >= it, the last bin
    takes the rest)."""

    categorical: dict[str, np.ndarray]  # name -> counts per index
    numeric_edges: dict[str, np.ndarray]
    numeric: dict[str, np.ndarray]  # name -> counts per bin (len(edges) + 1)
    score: np.ndarray  # counts per score bin (len(SCORE_EDGES) + 1)

    @classmethod
    def build(cls, spec, categorical: np.ndarray, numeric: np.ndarray, scores: np.ndarray,
              numeric_bins: int = 10) -> "Reference":
        cat = {f.name: np.bincount(categorical[:, i], minlength=max(f.vocabulary.values(), default=0) + 1
                                   ).astype(np.float64) for i, f in enumerate(spec.categorical)}
        edges, counts = {}, {}
        for i, name in enumerate(spec.numeric):
            column = numeric[:, i].astype(np.float64)
            # Decile edges of the training values (fewer where values repeat, e.g. small integer counts).
            inner = np.unique(np.quantile(column, np.linspace(0, 1, numeric_bins + 1)[1:-1]))
            edges[name] = inner
            counts[name] = _bin_counts(column, inner)
        return cls(cat, edges, counts, _bin_counts(np.asarray(scores, np.float64).ravel(), np.array(SCORE_EDGES)))

    def to_json(self) -> str:
        return json.dumps({"categorical": {k: v.tolist() for k, v in self.categorical.items()},
                           "numeric_edges": {k: v.tolist() for k, v in self.numeric_edges.items()},
                           "numeric": {k: v.tolist() for k, v in self.numeric.items()},
                           "score": self.score.tolist()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Reference":
        raw = json.loads(text)
        return cls({k: np.asarray(v, np.float64) for k, v in raw["categorical"].items()},
                   {k: np.asarray(v, np.float64) for k, v in raw["numeric_edges"].items()},
                   {k: np.asarray(v, np.float64) for k, v in raw["numeric"].items()},
                   np.asarray(raw["score"], np.float64))


def _bin_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges) + 1).astype(np.float64)


class DriftMonitor:
    """Live counts over the same bins as the reference, from a sample of the records, in fixed memory.

    Every `1 / sample_rate`-th record is counted (a stride, so the cost is one slice per batch). The counts are
    arrays of the reference's bins (memory is fixed); when they pass `max_rows` records they are halved, so old
    traffic fades out and the PSI follows the recent records.
    """

    def __init__(self, reference: Reference, feature_order: tuple[str, ...], numeric_order: tuple[str, ...],
                 sample_rate: float = 0.1, max_rows: int = 20_000):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"drift sample rate must be within (0, 1], got {sample_rate}")
        self.reference, self._categorical_order, self._numeric_order = reference, feature_order, numeric_order
        self._stride, self._offset, self._max_rows = max(1, round(1 / sample_rate)), 0, max_rows
        self._categorical = {n: np.zeros(len(c)) for n, c in reference.categorical.items()}
        self._numeric = {n: np.zeros(len(c)) for n, c in reference.numeric.items()}
        self._score = np.zeros(len(reference.score))
        self.sampled = 0

    def observe(self, categorical: np.ndarray, numeric: np.ndarray, scores: np.ndarray) -> None:
        """Rows of one batch (decoded records and their scores); only the sampled stride is counted."""
        rows = np.arange(self._offset, len(scores), self._stride)
        self._offset = (self._offset - len(scores)) % self._stride
        if not len(rows):
            return
        for i, name in enumerate(self._categorical_order):
            counts = self._categorical[name]
            index = np.clip(categorical[rows, i], 0, len(counts) - 1)
            counts += np.bincount(index, minlength=len(counts))
        for i, name in enumerate(self._numeric_order):
            self._numeric[name] += _bin_counts(numeric[rows, i].astype(np.float64), self.reference.numeric_edges[name])
        finite = np.asarray(scores, np.float64).ravel()[rows]
        self._score += _bin_counts(finite[np.isfinite(finite)], np.array(SCORE_EDGES))
        self.sampled += len(rows)
        while self._score.sum() > self._max_rows:
            for counts in (*self._categorical.values(), *self._numeric.values(), self._score):
                counts /= 2

    def psi(self) -> dict[str, float]:
        """PSI of the live sample against the reference, per feature and for the score (NaN before any record)."""
        out = {name: psi(self.reference.categorical[name], counts) for name, counts in self._categorical.items()}
        out.update({name: psi(self.reference.numeric[name], counts) for name, counts in self._numeric.items()})
        out[SCORE_FEATURE] = psi(self.reference.score, self._score)
        return out


class DriftWatch:
    """A monitor fed with every scored batch, publishing its PSI at most every `publish_seconds`. Monitoring never
    fails an answer: the first error is logged and watching stops."""

    def __init__(self, monitor: DriftMonitor, publish: Callable[[dict[str, float]], None], publish_seconds: float,
                 log: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.monitor, self._publish, self._every, self._log, self._clock = monitor, publish, publish_seconds, log, clock
        self._published_at = -float("inf")  # the first sampled batch sets the gauges

    def __call__(self, categorical: np.ndarray, numeric: np.ndarray, probability: np.ndarray) -> None:
        if self.monitor is None or not len(probability):
            return
        try:
            self.monitor.observe(categorical, numeric, probability)
            now = self._clock()
            if now - self._published_at >= self._every:
                self._published_at = now
                self._publish(self.monitor.psi())
        except Exception:  # noqa: BLE001 - see the class docstring
            self._log("drift monitoring stopped:\n" + traceback.format_exc())
            self.monitor = None
