"""What a parity run found: each candidate's differences from the reference, row by row, and the report's JSON and
table. Shared by the SavedModel/ONNX/Triton comparison (parity) and its tf.Example form (example_parity)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from s2t.backends.scoring.decision_policy import Thresholds, decide

# Relative error is reported against max(|reference|, this floor) so that probabilities near 0 do not blow it up.
REL_FLOOR = 1e-6
LIVE_BATCH = 64
# FP16 engines round weights and activations to 11-bit mantissas. Measured on the 1000 German Credit rows with
# the graph converted to float16 and run by ONNX Runtime on CPU: max abs 1.2e-4, mean 2.1e-5, no decision changed.
# The gate leaves 8x headroom for TensorRT's FP16 kernels (different accumulation order and fused layers).
FP16_ATOL = 1e-3


@dataclass(frozen=True)
class Comparison:
    candidate: str
    rows: int
    max_abs: float
    max_rel: float
    rows_over_tolerance: int
    worst_row: int
    over_tolerance: list[int] = field(default_factory=list)
    atol: float | None = None
    # Rows whose APPROVE/REVIEW/DECLINE differs from the legacy model's (None: no thresholds were given).
    decisions_changed: list[int] | None = None

    @property
    def passed(self) -> bool:
        return self.rows_over_tolerance == 0


@dataclass(frozen=True)
class ParityReport:
    reference: str
    atol: float
    rows: int
    comparisons: list[Comparison]
    divergence: dict | None = None
    # Rows whose legacy probability lies within `near_band` (the FP16 tolerance) of a decision threshold: where a
    # low-precision engine could change the decision while staying within tolerance.
    near_threshold: list[int] | None = None
    near_band: float = FP16_ATOL
    # One line per row that could not be scored everywhere, with each side's reason (tf.Example data).
    row_errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["passed"] = self.passed
        for c, comp in zip(raw["comparisons"], self.comparisons):
            c["passed"] = comp.passed
        return json.dumps(raw, indent=2) + "\n"

    def table(self) -> str:
        lines = [f"parity against {self.reference} on {self.rows} rows (atol {self.atol:g})",
                 f"{'candidate':<42} {'atol':>7} {'max abs':>10} {'max rel':>10} {'over tol':>9} {'worst row':>9} "
                 f"{'decisions':>9}  result"]
        for c in self.comparisons:
            changed = "-" if c.decisions_changed is None else str(len(c.decisions_changed))
            verdict = "PASS" if c.passed else "FAIL"
            lines.append(f"{c.candidate:<42} {c.atol:>7.0e} {c.max_abs:>10.3g} {c.max_rel:>10.3g} "
                         f"{c.rows_over_tolerance:>9d} {c.worst_row:>9d} {changed:>9}  {verdict}")
        for c in self.comparisons:
            if c.decisions_changed:
                lines.append(f"{c.candidate}: decision changed on rows {', '.join(map(str, c.decisions_changed))}")
        if self.near_threshold:
            lines.append(f"{len(self.near_threshold)} rows lie within {self.near_band:g} of a decision threshold "
                         f"(rows {', '.join(map(str, self.near_threshold[:20]))}"
                         f"{' ...' if len(self.near_threshold) > 20 else ''})")
        lines.extend(self.row_errors)
        if self.divergence:
            lines.append(f"first diverging node: {self.divergence['node']} ({self.divergence['op']}), "
                         f"max abs {self.divergence['max_abs']:.3g} on tensor {self.divergence['tensor']}")
        return "\n".join(lines)


def compare(candidate: str, reference: np.ndarray, scores: np.ndarray, atol: float,
            thresholds: Thresholds | None = None) -> Comparison:
    reference, scores = np.asarray(reference, np.float64).ravel(), np.asarray(scores, np.float64).ravel()
    if reference.shape != scores.shape:
        raise ValueError(f"{candidate}: {scores.size} scores for {reference.size} rows")
    diff = np.abs(reference - scores)
    diff[np.isnan(diff)] = np.inf
    rel = diff / np.maximum(np.abs(reference), REL_FLOOR)
    over = np.flatnonzero(diff > atol)
    changed = None
    if thresholds is not None:
        changed = np.flatnonzero(decide(reference, thresholds) != decide(scores, thresholds)).tolist()
    return Comparison(candidate, int(reference.size), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                      int(over.size), int(diff.argmax()) if diff.size else -1, over[:100].tolist(), atol, changed)
