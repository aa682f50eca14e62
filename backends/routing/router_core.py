"""risk_router's work on one batch, with the scorers behind a callable so that it runs without Triton.

Rows are routed one by one (sticky canary, forced routes, shadow sample), then scored group by group: one call
per target for the whole batch. The primary sits behind the circuit breaker: while it is open, or when a call
fails, its rows are answered by the fallback. A mirrored (shadow) call never changes an answer.

A forced route (the caller's `route` parameter) may name only a configured model and, with a version, one of that
model's version folders: anything else is the caller's InvalidInput, so no label or state ever holds client text.
Forced rows are scored in calls of their own and kept out of the figures the canary analysis reads (call seconds,
failed rows, and `forced` marks them for the score histograms): a caller choosing its version says nothing of how
the router's own split performs.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from s2t.backends.routing.circuit_breaker import BreakerSettings, CircuitBreaker
from s2t.backends.runtime.serving_errors import InvalidInput, NotServing, ServingError
from s2t.backends.runtime.model_parameters import VERSION_FOLDER, parameter, path_parameter, settings_of
from s2t.backends.records.record_decoder import max_record_bytes_parameter
from s2t.backends.routing.routing_policy import RoutingSettings, Target, route

NOT_SERVING_MEMORY_SECONDS = 0.5
# The version folders are listed at most this often, not on every batch: a version published since is found
# within it, and one retired since fails as "not serving" and is skipped like any other.
VERSION_LISTING_SECONDS = 0.5

# Raises a ServingError: NotServing when that version is not loaded (published but not loaded yet, or retired).
Scorer = Callable[[Target, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class RouterModelSettings:
    """risk_router's parameters: where records go (routing, breaker), how they are read, where drift is watched."""

    feature_spec: Path = path_parameter("feature_spec", within=VERSION_FOLDER)
    max_record_bytes: int = max_record_bytes_parameter()
    decision_model: str = parameter("decision_model", "risk_decision")
    drift_reference: str = parameter("drift_reference", "drift_reference.json")
    drift_sample_rate: float = parameter("drift_sample_rate", 1.0)
    drift_publish_seconds: float = parameter("drift_publish_seconds", 5.0)
    drift_window_records: int = parameter("drift_window_records", 2000)
    drift_alert_psi: float = parameter("drift_alert_psi", 0.2)
    routing: RoutingSettings = settings_of(RoutingSettings)
    breaker: BreakerSettings = settings_of(BreakerSettings)

    def __post_init__(self):
        if not 0.0 <= self.drift_sample_rate <= 1.0:
            raise ValueError(f"parameter drift_sample_rate: must be within 0..1, got {self.drift_sample_rate}")
        if self.drift_publish_seconds <= 0:
            raise ValueError(f"parameter drift_publish_seconds: must be positive, got {self.drift_publish_seconds}")
        if self.drift_window_records < 1:
            raise ValueError(f"parameter drift_window_records: must be at least 1, got {self.drift_window_records}")


@dataclass
class BatchAnswer:
    probability: np.ndarray  # float32 [rows, 1]; NaN where the row has an error
    served_by: list[str | None]
    errors: list[ServingError | None]
    shadow_differences: dict[str, np.ndarray] = field(default_factory=dict)  # candidate -> |candidate - primary|
    fallback_rows: int = 0
    # For canary analysis: seconds of each scoring call by the model:version that answered it, and rows whose
    # call failed by the target they were routed to.
    call_seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    failed_rows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # Rows whose caller forced the route: not part of the router's split, not counted for the analysis.
    forced: list[bool] = field(default_factory=list)


class Router:
    def __init__(self, settings: RoutingSettings, breaker: CircuitBreaker, score: Scorer,
                 versions: Callable[[str], Sequence[int]], clock: Callable[[], float] = time.monotonic):
        """`versions(model)`: the model's version folders, newest first, for targets that name no version."""
        self.settings, self.breaker, self._score, self._versions, self._clock = settings, breaker, score, versions, clock
        self._not_serving: dict[Target, float] = {}
        self._listed: dict[str, tuple[float, list[int]]] = {}  # model -> (listed until, versions newest first)

    def answer(self, categorical: np.ndarray, numeric: np.ndarray, keys: Sequence[str | bytes],
               overrides: Sequence[str | None]) -> BatchAnswer:
        n = len(keys)
        out = BatchAnswer(np.full((n, 1), np.nan, dtype=np.float32), [None] * n, [None] * n,
                          forced=[override is not None and override != "" for override in overrides])
        # A configured target is never the caller's mistake, even while its folder is being swapped.
        configured = {self.settings.primary, self.settings.candidate, self.settings.fallback}
        groups: dict[tuple[Target, bool], list[int]] = defaultdict(list)
        mirrors: dict[Target, list[int]] = defaultdict(list)
        for row, (key, override) in enumerate(zip(keys, overrides)):
            try:
                chosen = route(self.settings, key, override)
                if out.forced[row] and chosen.target not in configured:
                    self._check_forced_version(chosen.target)
            except ServingError as err:
                out.errors[row] = err
                continue
            groups[chosen.target, out.forced[row]].append(row)
            if chosen.mirror is not None:
                mirrors[chosen.mirror].append(row)
        for forced in (False, True):
            primary_rows = groups.pop((self.settings.primary, forced), [])
            if primary_rows:
                self._answer_primary(primary_rows, categorical, numeric, out, counted=not forced)
        for (target, forced), rows in groups.items():
            self._fill(target, rows, categorical, numeric, out, counted=not forced)
        for candidate, rows in mirrors.items():
            # Compare with the primary's own answers only: a row the fallback answered says nothing of the candidate.
            primary = self.settings.primary.model
            answered = [r for r in rows if (out.served_by[r] or "").partition(":")[0] == primary]
            if not answered:
                continue
            try:
                shadow, _ = self._call(candidate, categorical[answered], numeric[answered])
            except ServingError:
                continue
            out.shadow_differences[str(candidate)] = np.abs(shadow.ravel() - out.probability[answered].ravel())
        return out

    def _check_forced_version(self, target: Target) -> None:
        """A forced version must be one of the model's version folders (the model is a configured one: checked by
        `route`): any other number is the caller's mistake, refused before it is used anywhere."""
        if target.version is None:
            return
        versions = self._listed_versions(target.model, self._clock())
        if target.version not in versions:
            listed = ", ".join(str(v) for v in sorted(versions)) or "none"
            raise InvalidInput(f"route: {target.model} has no version {target.version} (versions: {listed})")

    def _answer_primary(self, rows, categorical, numeric, out: BatchAnswer, counted: bool = True) -> None:
        fallback = self.settings.fallback
        if not self.breaker.allow() and fallback is not None:
            out.fallback_rows += len(rows)
            self._fill(fallback, rows, categorical, numeric, out, counted)
            return
        started = self._clock()
        try:
            probability, served = self._call(self.settings.primary, categorical[rows], numeric[rows])
        except ServingError as err:
            self.breaker.record(False, self._clock() - started, len(rows))
            if counted:
                out.failed_rows[str(self.settings.primary)] += len(rows)
            if fallback is None:
                for r in rows:
                    out.errors[r] = err
                return
            out.fallback_rows += len(rows)
            self._fill(fallback, rows, categorical, numeric, out, counted)
            return
        self.breaker.record(True, self._clock() - started, len(rows))
        if counted:
            out.call_seconds[served].append(self._clock() - started)
        out.probability[rows] = probability.reshape(-1, 1)
        for r in rows:
            out.served_by[r] = served

    def _fill(self, target: Target, rows, categorical, numeric, out: BatchAnswer, counted: bool = True) -> None:
        started = self._clock()
        try:
            probability, served = self._call(target, categorical[rows], numeric[rows])
        except ServingError as err:
            if counted:
                out.failed_rows[str(target)] += len(rows)
            for r in rows:
                out.errors[r] = err
            return
        if counted:
            out.call_seconds[served].append(self._clock() - started)
        out.probability[rows] = probability.reshape(-1, 1)
        for r in rows:
            out.served_by[r] = served

    def _listed_versions(self, model: str, now: float) -> list[int]:
        until, versions = self._listed.get(model, (-1.0, []))
        if until <= now:
            versions = list(self._versions(model))
            self._listed[model] = (now + VERSION_LISTING_SECONDS, versions)
        return versions

    def _call(self, target: Target, categorical: np.ndarray, numeric: np.ndarray) -> tuple[np.ndarray, str]:
        """Score on `target`; a target without a version tries the newest version folder that is serving."""
        if target.version is not None:
            candidates = [target]
        else:
            now = self._clock()
            candidates = [Target(target.model, v) for v in self._listed_versions(target.model, now)
                          if self._not_serving.get(Target(target.model, v), -1.0) < now]
            if not candidates:
                raise NotServing(f"{target.model}: no version is serving")
        # The last failure's kind and message, not the exception: one kept in a local holds its traceback, the
        # traceback this frame, and the frame the exception, a cycle that keeps the batch's requests until a
        # garbage collection.
        failure: tuple[type[ServingError], str] | None = None
        for concrete in candidates:
            try:
                return self._score(concrete, categorical, numeric), str(concrete)
            except ServingError as err:
                failure = (type(err), err.message)
                if target.version is not None or not isinstance(err, NotServing):
                    break
                self._not_serving[concrete] = self._clock() + NOT_SERVING_MEMORY_SECONDS
        kind, message = failure
        raise kind(f"{target}: {message}")
