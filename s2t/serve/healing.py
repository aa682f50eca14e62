"""Healing decisions, apart from /proc, HTTP and threads: what counts as a failing model, when to try again, when
to give up, and the record of what was done.

Standard library only: the same code runs under `s2t serve` and inside the NGC container (its system Python).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from s2t.atomic_files import write_atomically
from s2t.prometheus_text import Metrics, samples_named

# Triton's failure reason that says the model itself failed. REJECTED is a full queue and CANCELED the caller; OTHER
# is whatever failed outside the model (a request Triton could not take). A request answered with its own error
# (an invalid record, an unknown route) is no failure at all: the python and in-process backends count it as
# answered, so no caller can make a model look sick.
MODEL_FAILURE_REASONS = frozenset({"BACKEND"})
# The in-process backend's gauge (native/python_inprocess.cc): per instance, the wall-clock start (epoch seconds)
# of the execute in progress, 0 when none runs.
EXECUTE_STARTED = "s2t_execute_started_seconds"


@dataclass(frozen=True)
class ErrorRateSettings:
    threshold: float = 0.10
    seconds: float = 5.0
    # Fewer failures than this over the whole span is noise, not a failing instance.
    min_failures: int = 5


@dataclass
class _Streak:
    since: float
    failures: int = 0


@dataclass
class ErrorRateWatch:
    """Which models have failed more than `threshold` of their requests for `seconds` in a row.

    Fed cumulative counters (Triton's nv_inference_request_success / _failure); each interval with traffic either
    extends a failing streak (rate over the threshold) or ends it. An interval without traffic changes nothing.
    """

    settings: ErrorRateSettings = field(default_factory=ErrorRateSettings)
    _last: dict[str, tuple[float, float]] = field(default_factory=dict)
    _streaks: dict[str, _Streak] = field(default_factory=dict)

    def observe(self, counters: dict[str, tuple[float, float]], now: float) -> list[tuple[str, float]]:
        """counters: model -> (successes, failures) so far. Returns (model, rate over the streak) to heal."""
        failing = []
        for model, (success, failure) in counters.items():
            last = self._last.get(model)
            self._last[model] = (success, failure)
            if last is None:
                continue
            # A reload restarts Triton's counters: a drop is a new start, not negative traffic.
            ok, bad = max(success - last[0], 0.0), max(failure - last[1], 0.0)
            if ok + bad == 0:
                continue
            if bad / (ok + bad) <= self.settings.threshold:
                self._streaks.pop(model, None)
                continue
            streak = self._streaks.setdefault(model, _Streak(since=now))
            streak.failures += int(bad)
            if now - streak.since >= self.settings.seconds and streak.failures >= self.settings.min_failures:
                failing.append((model, bad / (ok + bad)))
                del self._streaks[model]
        return failing

    def forget(self, model: str) -> None:
        self._streaks.pop(model, None)
        self._last.pop(model, None)


def request_counters(metrics: Metrics, models: set[str] | None = None) -> dict[str, tuple[float, float]]:
    """model -> (successes, model failures) summed over versions, from Triton's metrics."""
    counters: dict[str, list[float]] = {}
    for slot, name in enumerate(("nv_inference_request_success", "nv_inference_request_failure")):
        for labels, value in samples_named(metrics, name):
            model = labels.get("model")
            if model is None or (models is not None and model not in models):
                continue
            if slot == 1 and labels.get("reason", "BACKEND") not in MODEL_FAILURE_REASONS:
                continue
            counters.setdefault(model, [0.0, 0.0])[slot] += value
    return {model: (ok, bad) for model, (ok, bad) in counters.items()}


@dataclass(frozen=True)
class HangSettings:
    # An execute that has not returned after this long is stuck for good: Triton never ends one, the in-process
    # interpreter it holds is every in-process model's, and risk_pipeline's batches take milliseconds.
    seconds: float = 10.0


@dataclass(frozen=True)
class StuckExecute:
    model: str
    instance: str
    seconds: float


def stuck_executes(metrics: Metrics, now: float, settings: HangSettings) -> list[StuckExecute]:
    """Every execute in progress for longer than the bound, by Triton's metrics (the in-process backend's gauge)."""
    stuck = []
    for labels, started in samples_named(metrics, EXECUTE_STARTED):
        if started > 0 and now - started > settings.seconds:
            stuck.append(StuckExecute(labels.get("model", "?"), labels.get("instance", "?"), now - started))
    return stuck


def doubling_delay(retries_before: int, first_seconds: float, max_seconds: float) -> float:
    """The wait before a retry: `first_seconds` when none came before, twice as long after each, at most
    `max_seconds` (the keeper's server restarts and the supervisor's model reloads back off alike)."""
    return min(first_seconds * 2 ** max(retries_before, 0), max_seconds)


@dataclass(frozen=True)
class HealSettings:
    first_delay_seconds: float = 1.0
    max_delay_seconds: float = 30.0
    # Heals of one model with no quiet period between them; past this the model is given up (escalated).
    max_attempts: int = 5
    # This long without a new heal and the model counts as healthy again: its attempts start over.
    quiet_seconds: float = 120.0


@dataclass
class _Attempts:
    count: int = 0
    last_at: float = 0.0
    retry_at: float | None = None
    retry_reason: str = ""
    given_up: bool = False


@dataclass
class HealPolicy:
    """When a model may be reloaded: right away the first time, then after a doubling delay, at most
    `max_attempts` times in a row; a failed reload is retried on the same schedule."""

    settings: HealSettings = field(default_factory=HealSettings)
    _models: dict[str, _Attempts] = field(default_factory=dict)

    def delay(self, attempts: int) -> float:
        return doubling_delay(attempts - 1, self.settings.first_delay_seconds, self.settings.max_delay_seconds)

    def ask(self, model: str, reason: str, now: float) -> str:
        """'now': reload it; 'later': a retry is already scheduled; 'give_up': the cap is reached."""
        state = self._models.setdefault(model, _Attempts())
        if state.given_up:
            return "give_up"
        if state.count and now - state.last_at >= self.settings.quiet_seconds:
            state.count = 0
        if state.count >= self.settings.max_attempts:
            state.given_up = True
            return "give_up"
        if state.count and now < state.last_at + self.delay(state.count):
            state.retry_at, state.retry_reason = state.last_at + self.delay(state.count), reason
            return "later"
        state.count += 1
        state.last_at, state.retry_at = now, None
        return "now"

    def failed(self, model: str, reason: str, now: float) -> None:
        """The reload itself failed: try again after the current delay."""
        state = self._models.setdefault(model, _Attempts())
        state.retry_at, state.retry_reason = now + self.delay(state.count), reason

    def due(self, now: float) -> list[tuple[str, str]]:
        """(model, reason) of the scheduled retries whose time has come."""
        ready = [(m, s.retry_reason) for m, s in self._models.items()
                 if s.retry_at is not None and s.retry_at <= now and not s.given_up]
        for model, _ in ready:
            self._models[model].retry_at = None
        return ready

    def attempts(self, model: str) -> int:
        return self._models.get(model, _Attempts()).count


# How many past events supervisor.json keeps.
EVENTS_KEPT = 50


@dataclass
class SupervisorState:
    """What the supervisor did, as counters (Prometheus) and as `supervisor.json` for `s2t status`."""

    path: Path | None = None
    reloads: dict[tuple[str, str], int] = field(default_factory=dict)
    reload_failures: dict[str, int] = field(default_factory=dict)
    given_up: set[str] = field(default_factory=set)
    server_restarts: int = 0
    server_hangs: int = 0
    # Every model seen in Triton's counters: the given-up gauge is exported for each, 0 or 1.
    watched: set[str] = field(default_factory=set)
    server_pid: int | None = None
    events: list[dict] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _write_error: str | None = None

    def record(self, kind: str, model: str | None = None, reason: str = "", detail: str = "") -> None:
        with self._lock:
            if kind == "reload":
                self.reloads[(model, reason)] = self.reloads.get((model, reason), 0) + 1
            elif kind == "reload_failed":
                self.reload_failures[model] = self.reload_failures.get(model, 0) + 1
            elif kind == "gave_up":
                self.given_up.add(model)
            elif kind == "server_restart":
                self.server_restarts += 1
            elif kind == "server_hung":
                self.server_hangs += 1
            event = {"at": round(time.time(), 3), "event": kind}
            event.update({k: v for k, v in (("model", model), ("reason", reason), ("detail", detail)) if v})
            self.events = (self.events + [event])[-EVENTS_KEPT:]
        self.save()

    def watch(self, models: set[str]) -> None:
        with self._lock:
            self.watched |= models

    def server_started(self, pid: int) -> None:
        with self._lock:
            self.server_pid = pid
            self.given_up.clear()
        self.save()

    def to_dict(self) -> dict:
        with self._lock:
            return {
                "server_pid": self.server_pid,
                "started_at": round(self.started_at, 3),
                "server_restarts": self.server_restarts,
                "reloads": [{"model": m, "reason": r, "count": n} for (m, r), n in sorted(self.reloads.items())],
                "reload_failures": dict(sorted(self.reload_failures.items())),
                "given_up": sorted(self.given_up),
                "server_hangs": self.server_hangs,
                "events": list(self.events),
            }

    def save(self) -> None:
        if self.path is None:
            return
        try:
            write_atomically(self.path, json.dumps(self.to_dict(), indent=1) + "\n")
        except OSError as err:
            # A read-only control area must not stop healing; say so once.
            if self._write_error is None:
                self._write_error = str(err)
                print(f"s2t supervisor: cannot write {self.path}: {err}", flush=True)

    def prometheus(self) -> str:
        with self._lock:
            lines = ["# HELP s2t_supervisor_reloads_total Models reloaded by the supervisor, by reason.",
                     "# TYPE s2t_supervisor_reloads_total counter"]
            lines += [f's2t_supervisor_reloads_total{{model="{m}",reason="{r}"}} {n}'
                      for (m, r), n in sorted(self.reloads.items())]
            lines += ["# HELP s2t_supervisor_reload_failures_total Reload requests that failed (retried later).",
                      "# TYPE s2t_supervisor_reload_failures_total counter"]
            lines += [f's2t_supervisor_reload_failures_total{{model="{m}"}} {n}'
                      for m, n in sorted(self.reload_failures.items())]
            lines += ["# HELP s2t_supervisor_given_up Models the supervisor stopped reloading (1) after its cap.",
                      "# TYPE s2t_supervisor_given_up gauge"]
            lines += [f's2t_supervisor_given_up{{model="{m}"}} {int(m in self.given_up)}'
                      for m in sorted(self.given_up | self.watched)]
            lines += ["# HELP s2t_server_hangs_total tritonserver processes aborted because an execute did not return.",
                      "# TYPE s2t_server_hangs_total counter",
                      f"s2t_server_hangs_total {self.server_hangs}"]
            lines += ["# HELP s2t_server_restarts_total tritonserver processes started again after one died.",
                      "# TYPE s2t_server_restarts_total counter",
                      f"s2t_server_restarts_total {self.server_restarts}"]
            return "\n".join(lines) + "\n"


STATE_FILE = "supervisor.json"
