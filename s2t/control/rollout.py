"""Staged rollouts of a scorer: stage a candidate, canary it, promote it, roll it back.

A model whose version policy loads every version folder (`version_policy: { all: {} }`) has an explicit
primary: the version every consumer (s2t/control/primary.py) serves. A rollout step moves version folders and
rewrites consumer configs; which folders the repository holds is what Triton loads:

- primary: what every path serves;
- previous: the primary before, still loaded, so a rollback after a promotion loads nothing;
- candidate: a staged version, loaded and reachable as MODEL:N (route override, shadow, canary), never primary;
- draining: versions nothing should route to any more; their folders are retired once the consumers that
  used them have surely been reloaded (at once after `--http-url` confirmed it, otherwise by a later command).

Every step holds the control lock, records its history line before it acts (a failure to write the history
stops the command before it changes anything) and writes the state file last. With `url` it waits until the
live server runs the change (explicit mode: it asks for the loads through the restricted API).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from backends.routing_policy import Target
from s2t.control import canary as canary_config
from s2t.control import live_control, primary
from s2t.gate import model_config
from backends.atomic_files import write_atomically
from s2t.control.version_store import VersionStore

# Without a server to ask, how long a version that was routed to stays loaded after the step that stopped it:
# a poll (1 s) plus the reload of the router's stub and of the pipeline (2-4 s measured here), with margin.
DRAIN_SECONDS = 15.0
# After the server confirmed the new configs, requests already inside the old instances still finish.
SETTLE_SECONDS = 1.0


class RolloutError(Exception):
    """The step was refused; nothing changed."""


@dataclass
class RolloutState:
    primary: int | None = None
    previous: int | None = None
    candidate: int | None = None
    draining: dict[int, float] = field(default_factory=dict)  # version -> time after which it may be retired

    def kept(self) -> set[int]:
        return {v for v in (self.primary, self.previous, self.candidate) if v is not None} | set(self.draining)

    def to_json(self) -> str:
        data = asdict(self)
        data["draining"] = {str(k): v for k, v in self.draining.items()}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "RolloutState":
        data = json.loads(text)
        return cls(data.get("primary"), data.get("previous"), data.get("candidate"),
                   {int(k): float(v) for k, v in data.get("draining", {}).items()})


@dataclass(frozen=True)
class Rollout:
    """A model's folders, the repositories its consumers live in, and the live server to confirm on."""

    model: str
    repository: Path
    consumer_repositories: tuple[Path, ...] = ()
    url: str | None = None
    key: str | None = None
    # Seconds until the live server ran each change (filled with `url`), for the operator and the figures.
    timings: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def store(self) -> VersionStore:
        return VersionStore(Path(self.repository))

    @property
    def repositories(self) -> tuple[Path, ...]:
        """Where consumers live: the model's repository, and the given ones (default: ./ensembles beside it)."""
        return (Path(self.repository), *(self.consumer_repositories or default_consumer_repositories(self.repository)))

    @property
    def drain_seconds(self) -> float:
        """How long a version that was routed to stays loaded: confirmed reloads need only the in-flight requests."""
        return SETTLE_SECONDS if self.url else DRAIN_SECONDS

    @property
    def state_file(self) -> Path:
        return self.store.control / "rollout" / f"{self.model}.json"

    def config(self):
        model_dir = self.store.model_dir(self.model)
        if not (model_dir / "config.pbtxt").is_file():
            raise RolloutError(f"{model_dir} has no config.pbtxt")
        return model_config.load(model_dir)

    def explicit_primary(self) -> bool:
        return loads_every_folder(self.config())

    # ---- state ----
    def state(self) -> RolloutState:
        if self.state_file.is_file():
            return RolloutState.from_json(self.state_file.read_text())
        return self._initial_state()

    def _initial_state(self) -> RolloutState:
        """Before the first step: the version the consumers pin, else the newest folder (what Triton served)."""
        served = self.store.served(self.model)
        pinned = {c.version for c in primary.consumers(self.model, self.repositories) if c.version in served}
        current = max(pinned) if pinned else max(served, default=None)
        older = [v for v in served if current is not None and v < current]
        return RolloutState(current, older[-1] if older else None, None,
                            {v: 0.0 for v in older[:-1]})

    def save(self, state: RolloutState) -> None:
        write_atomically(self.state_file, state.to_json())

    # ---- the steps' common parts ----
    @contextmanager
    def step(self) -> Iterator[RolloutState]:
        """Under the control lock: the state to change, saved when the body succeeds."""
        with self.store.lock():
            state = self.state()
            yield state
            if self.explicit_primary():
                self.save(state)

    def record(self, event: dict) -> None:
        try:
            self.store.record({"model": self.model, **event})
        except OSError as err:
            raise RolloutError(f"cannot write the history {self.store.history_file} ({err.strerror or err}); "
                               "nothing was changed") from None

    def record_failure(self, event: dict, err: Exception) -> None:
        try:
            self.store.record({"model": self.model, **event, "outcome": "failed", "error": str(err)})
        except OSError:
            pass  # the failure itself is reported to the caller; the step's own line is there already

    def point_consumers(self, version: int, router_split: dict[str, str] | None = None) -> list[str]:
        """Every consumer serves `version`; returns the models whose config changed (confirmed with url)."""
        changes = [c for c in primary.plan(self.model, version, self.repositories, router_split)
                   if c.text != c.path.read_text()]
        # Only consumers the server runs now are waited for: one it has not loaded (explicit mode: the operator's
        # choice) reads the new config whenever it is loaded, and a rollout never loads it as a side effect.
        live = live_control.loaded(self.url, [c.name for c in changes]) if self.url else set()
        primary.write(self.store, changes)
        if self.url:
            self.confirm([c for c in changes if c.name in live])
        return [c.name for c in changes]

    def confirm(self, changes: list) -> None:
        """Ask for each reload (explicit mode) and wait for it: the step is in force when the last one is."""
        started = time.monotonic()
        # One reload at a time: concurrent explicit loads of an ensemble and of models beside it were seen to
        # leave the ensemble on its old config (Triton reloads dependents from the config it read first).
        for change in changes:
            self.timings[change.name] = live_control.wait_config(self.url, change.name, change.in_force,
                                                                 key=self.key)
        self.timings["in force"] = time.monotonic() - started

    def wait_loaded(self, version: int) -> None:
        if self.url:
            live_control.wait_version_ready(self.url, self.model, version, key=self.key)

    def drain(self, state: RolloutState, versions: Iterable[int | None], seconds: float) -> None:
        """Retire these versions (unless a role keeps them) once `seconds` have passed."""
        due = time.time() + seconds
        for version in versions:
            if version is not None and version not in {state.primary, state.previous, state.candidate}:
                state.draining[version] = due

    def retire_drained(self, state: RolloutState) -> list[int]:
        """Retire the folders whose drain time passed (and folders no step keeps, such as pre-rollout ones)."""
        now = time.time()
        soon = [due - now for due in state.draining.values() if 0 < due - now <= SETTLE_SECONDS]
        if self.url and soon:
            time.sleep(max(soon))
            now = time.time()
        keep = {v for v in (state.primary, state.previous, state.candidate) if v is not None}
        keep |= {v for v, due in state.draining.items() if due > now}
        retired = []
        for version in self.store.served(self.model):
            if version not in keep:
                self.store.retire(self.model, version)
                retired.append(version)
        state.draining = {v: due for v, due in state.draining.items() if due > now}
        if retired and self.url:
            for version in retired:
                live_control.wait_version_gone(self.url, self.model, version, key=self.key)
        return retired


def loads_every_folder(config) -> bool:
    """Triton loads every version folder: the tools, not "the newest folder", decide which one is primary."""
    return config.version_policy.WhichOneof("policy_choice") == "all"


def default_consumer_repositories(repository: Path) -> tuple[Path, ...]:
    """The ensembles repository beside the model repository, where risk_pipeline lives as an ensemble."""
    sibling = Path(repository).resolve().parent / "ensembles"
    return (sibling,) if sibling.is_dir() else ()


def _require_served(rollout: Rollout, version: int, what: str) -> None:
    served = rollout.store.served(rollout.model)
    if version not in served:
        hint = " (retired: `s2t rollback --to` brings it back)" if version in rollout.store.retired(rollout.model) else ""
        raise RolloutError(f"{rollout.model} has no loaded version {version} to {what}{hint} "
                           f"(versions: {', '.join(map(str, served)) or 'none'})")


def _router_split_of(rollout: Rollout) -> dict[str, str] | None:
    """Clear risk_router's split when its candidate is a version of this model."""
    for consumer in primary.consumers(rollout.model, rollout.repositories):
        if consumer.kind == primary.ROUTER_KIND:
            params = model_config.backend_parameters(model_config.load(consumer.path.parent))
            candidate = params.get("candidate", {}).get("string_value", "").strip()
            if candidate and Target.parse(candidate).model == rollout.model:
                return dict(primary.NO_SPLIT)
    return None


def promote(rollout: Rollout, version: int) -> int:
    """`version` becomes the primary on every path in one step; the split is cleared; the old primary stays loaded."""
    if not rollout.explicit_primary():
        raise RolloutError(f"{rollout.model}: promotion needs `version_policy: {{ all: {{}} }}` in its config "
                           "(with a `latest` policy the newest folder is always the primary)")
    event = {"action": "promote", "version": version}
    with rollout.step() as state:
        if version == state.primary:
            raise RolloutError(f"{rollout.model} version {version} is the primary already")
        _require_served(rollout, version, "promote")
        event["from"] = state.primary
        rollout.record(event)
        try:
            rollout.wait_loaded(version)
            rollout.point_consumers(version, dict(primary.NO_SPLIT))
        except Exception as err:
            rollout.record_failure(event, err)
            raise
        old_previous = state.previous
        state.primary, state.previous = version, event["from"]
        state.candidate = None
        state.draining.pop(version, None)
        rollout.drain(state, [old_previous], 0.0)  # nothing routed to it
        rollout.retire_drained(state)
    return version


@dataclass(frozen=True)
class RollbackPlan:
    action: str  # "abort": retire the candidate; "revert": serve an earlier version
    primary: int
    target: int  # the version served once done
    retiring: int | None

    def describe(self, model: str) -> str:
        if self.action == "abort":
            return f"{model}: abort the canary of version {self.retiring}; version {self.primary} stays primary"
        return f"{model}: serve version {self.target} instead of {self.primary}"


def rollback_plan(rollout: Rollout, to: int | None) -> RollbackPlan:
    state = rollout.state()
    if state.primary is None:
        raise RolloutError(f"{rollout.model} has no version in {rollout.repository}")
    if to is None:
        if state.candidate is not None:
            return RollbackPlan("abort", state.primary, state.primary, state.candidate)
        if state.previous is None:
            raise RolloutError(f"{rollout.model} has only version {state.primary} loaded; name one with --to")
        return RollbackPlan("revert", state.primary, state.previous, state.primary)
    if to == state.primary:
        raise RolloutError(f"{rollout.model} version {to} is already served")
    store = rollout.store
    if to not in store.served(rollout.model) and to not in store.retired(rollout.model):
        known = sorted(set(store.served(rollout.model)) | set(store.retired(rollout.model)))
        raise RolloutError(f"{rollout.model} has no version {to} (known: {', '.join(map(str, known))})")
    return RollbackPlan("revert", state.primary, to, state.primary)


def rollback(rollout: Rollout, expected: RollbackPlan) -> RollbackPlan:
    """Carry out `expected` (what the operator confirmed); refused if the state moved on since."""
    to = expected.target if expected.action == "revert" else None
    with rollout.step() as state:
        done = rollback_plan(rollout, to)
        if done != expected:
            raise RolloutError(f"the rollout changed since it was planned (now: {done.describe(rollout.model)})")
        event = {"action": "rollback", "from": state.primary, "to": done.target, "aborted": done.action == "abort",
                 "retiring": done.retiring}
        rollout.record(event)
        try:
            if done.action == "abort":
                split = _router_split_of(rollout)
                rollout.point_consumers(state.primary, split)
                state.candidate = None
                rollout.drain(state, [done.retiring], rollout.drain_seconds)
            else:
                if done.target not in rollout.store.served(rollout.model):
                    rollout.store.restore(rollout.model, done.target)
                state.draining.pop(done.target, None)
                rollout.wait_loaded(done.target)
                rollout.point_consumers(done.target, dict(primary.NO_SPLIT))
                old = [state.primary, state.candidate]
                state.primary, state.previous, state.candidate = done.target, None, None
                rollout.drain(state, old, rollout.drain_seconds)
            rollout.retire_drained(state)
        except Exception as err:
            rollout.record_failure(event, err)
            raise
    return done


def canary(rollout: Rollout, version: int | None, canary_percent: float, shadow_percent: float,
           candidate_repositories: tuple[Path, ...] = ()):
    """risk_router splits between the primary and `version` (None: no split). Returns the RoutingSettings."""
    candidate = None if version is None else Target(rollout.model, version)
    managed = rollout.explicit_primary()
    with rollout.step() as state:
        if managed and version is not None:
            if version == state.primary:
                raise RolloutError(f"{rollout.model} version {version} is the primary; a canary needs another")
            if state.candidate is not None and version != state.candidate:
                raise RolloutError(f"{rollout.model} version {state.candidate} is the candidate; promote it or "
                                   "roll it back first")
        settings, change = canary_config.split_change(rollout.repository, candidate, canary_percent, shadow_percent,
                                                      candidate_repositories)
        event = {"action": "canary", "model": canary_config.ROUTER, "scorer": rollout.model,
                 "split": settings.describe()}
        try:
            rollout.store.record(event)
        except OSError as err:
            raise RolloutError(f"cannot write the history ({err.strerror or err}); nothing was changed") from None
        try:
            primary.write(rollout.store, [change])
            if rollout.url:
                rollout.confirm([change])
        except Exception as err:
            rollout.record_failure(event, err)
            raise
        if managed and version is not None:
            state.candidate = version
            state.draining.pop(version, None)
        if managed:
            rollout.retire_drained(state)
    return settings
