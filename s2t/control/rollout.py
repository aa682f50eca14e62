"""Every step that changes what a scorer serves: publish, stage, canary, promote, rollback (abort or revert).

A model whose version policy loads every version folder (`version_policy: { all: {} }`) has an explicit
primary: the version every consumer (s2t/control/primary.py) serves. A rollout step moves version folders and
rewrites consumer configs; which folders the repository holds is what Triton loads:

- primary: what every path serves;
- previous: the primary before, still loaded, so a rollback after a promotion loads nothing;
- candidate: a staged version, loaded and reachable as MODEL:N (route override, shadow, canary), never primary;
- draining: versions nothing should route to any more; their folders are retired once the consumers that
  used them have surely been reloaded (at once after `--http-url` confirmed it, otherwise by a later command).

A model whose config pins its versions (`version_policy: { specific: { versions: [ ... ] } }`, as `llm`) is its
own consumer: its primary is the newest version the policy lists, which callers that name no version get. A step
rewrites that line and the server loads the new version before it unloads the old one, which finishes the
requests it has (a decoupled model's streams included: Triton unloads a version once every response sender has
sent its final flag). `previous` stays listed, loaded, when it is older than the primary, so the usual rollback
(after a promotion) only unloads; a newer one cannot stay loaded, it would take the callers. Its candidate is a
validated folder that is not loaded until promoted, or until a canary through its router (llm_router, a consumer
with a `primary` like risk_router) sends it generations: each step then loads what it adds before the router
names it and unloads what it drops after (`primary.phases`).

A model with a `latest` policy (risk_scorer_lite, the GPU scorers) serves its newest folder: its rollback retires
the newer folders instead, newest first, so the newest folder left is always one that was served before.

Every step holds the control lock and goes through `Rollout.begin` before it changes anything: the history line
is written (or the step is refused, nothing changed), then the state file is saved with the step as `pending` (a
write-ahead intent). The state without `pending` is written last. A command killed in between leaves `pending`
behind; the next command first undoes what that step got done (`Rollout.recover`): the consumers serve the
primary from before it again, and every version a consumer named drains, so nothing they may serve is retired. With
`url` every step waits until the live server
runs the change (explicit mode: it asks for the loads through the restricted API).
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from s2t.backends.runtime import fault_points
from s2t.atomic_files import write_atomically
from s2t.backends.routing.routing_policy import Target
from s2t.control import split_config as canary_config
from s2t.control import config_cache, live_control, primary
from s2t.control.version_store import VersionStore
from s2t import triton_config
from s2t.errors import S2TError

# Without a server to ask, how long a version that was routed to stays loaded after the step that stopped it:
# a poll (1 s) plus the reload of the router's stub and of the pipeline (2-4 s measured here), with margin.
DRAIN_SECONDS = 15.0
# After the server confirmed the new configs, requests already inside the old instances still finish.
SETTLE_SECONDS = 1.0


class RolloutError(S2TError):
    """The step was refused; nothing changed."""


def reached(boundary: str) -> None:
    """A boundary between two writes of a step: where `S2T_FAULT_POINTS=control.<boundary>=kill` stops the command."""
    fault_points.check(f"control.{boundary}")


@dataclass
class RolloutState:
    primary: int | None = None
    previous: int | None = None
    candidate: int | None = None
    draining: dict[int, float] = field(default_factory=dict)  # version -> time after which it may be retired
    # Until then a consumer may still run `previous` (it was the primary): once it loses that role it drains.
    previous_until: float = 0.0
    # The history event of a step that began and has not finished: set, the roles above are from before it.
    pending: dict | None = None

    def kept(self) -> set[int]:
        return {v for v in (self.primary, self.previous, self.candidate) if v is not None} | set(self.draining)

    def roles(self) -> set[int]:
        return {v for v in (self.primary, self.previous, self.candidate) if v is not None}

    def to_json(self) -> str:
        data = asdict(self)
        data["draining"] = {str(k): v for k, v in self.draining.items()}
        if self.pending is None:
            del data["pending"]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "RolloutState":
        data = json.loads(text)
        return cls(data.get("primary"), data.get("previous"), data.get("candidate"),
                   {int(k): float(v) for k, v in data.get("draining", {}).items()},
                   float(data.get("previous_until", 0.0)), data.get("pending"))


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
        return config_cache.load(model_dir)

    def explicit_primary(self) -> bool:
        config = self.config()
        return loads_every_folder(config) or primary.pinned_version(config) is not None

    def pinned(self) -> bool:
        """The model's own config lists the versions it loads: a version is loaded only once a step lists it."""
        return primary.pinned_version(self.config()) is not None

    def keeps_state(self) -> bool:
        """Roles and a state file: a model of this repository with an explicit primary (a canary candidate from
        another repository, such as a GPU scorer, has neither)."""
        return (self.store.model_dir(self.model) / "config.pbtxt").is_file() and self.explicit_primary()

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

    def recovered_state(self) -> RolloutState:
        """The state, put right first (under the lock) if a command died during its step: what a plan that the
        operator confirms must be based on."""
        if self.state().pending is None:
            return self.state()
        with self.step() as state:
            return state

    def save(self, state: RolloutState) -> None:
        write_atomically(self.state_file, state.to_json())

    # ---- the steps' common parts ----
    @contextmanager
    def step(self) -> Iterator[RolloutState]:
        """Under the control lock: the state to change (recovered first if a command died during its step),
        saved when the body succeeds. A body that fails after `begin` gets its failure line; its intent stays,
        so the next step undoes what it got done (`recover`)."""
        with self.store.lock():
            managed = self.keeps_state()
            state = self.state()
            if managed and state.pending is not None:
                state = self.recover(state)
            try:
                yield state
            except Exception as err:
                if state.pending is not None:
                    self.record_failure(state.pending, err)
                raise
            if managed:
                state.pending = None
                self.save(state)
                reached("saved")

    def begin(self, state: RolloutState, event: dict) -> None:
        """Record the step's history line (or refuse: nothing changed), then its intent; call before any change."""
        self.record(event)
        reached("recorded")
        state.pending = {"model": self.model, **event}
        if self.keeps_state():
            intent = RolloutState(state.primary, state.previous, state.candidate, dict(state.draining),
                                  state.previous_until, state.pending)
            self.save(intent)
        reached("intent")

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

    def recover(self, state: RolloutState) -> RolloutState:
        """A step began and never finished (killed, or failed half-way): undo what it got done, so that running
        the command again does it again (a rollback run twice would otherwise flip back).

        The state file still holds the roles from before the step: every consumer serves that primary again
        (confirmed on the live server with `url`, whether or not its file changed: the step may have died
        between a write and its load). What the repository holds decides the rest: a role whose folder is gone
        is dropped, and every folder a consumer named, or that has no role, drains as if it had just been
        routed to, so nothing a live consumer may still run is retired under it."""
        store, pending = self.store, state.pending or {}
        named = self.named_by_consumers()
        for version in named:
            if version not in store.served(self.model) and version in store.retired(self.model):
                store.restore(self.model, version)  # a consumer serves it: its folder must be there
        served = set(store.served(self.model))
        now = state.primary if state.primary in served else max(named & served or served, default=None)
        router_candidate = _router_candidate(self)
        split = None
        if router_candidate is not None and (router_candidate not in served or router_candidate == now):
            split, router_candidate = dict(primary.NO_SPLIT), None
        previous = state.previous if state.previous in served and state.previous != now else None
        if now is not None:
            self.point_consumers(now, split, confirm_all=True, standby=previous)
        candidate = router_candidate if router_candidate is not None else state.candidate
        candidate = candidate if candidate in served and candidate not in (now, previous) else None
        due = time.time() + self.drain_seconds
        recovered = RolloutState(now, previous, candidate, previous_until=max(state.previous_until, due))
        for version in served - recovered.roles():
            old_due = state.draining.get(version)
            # Draining before the step and named by no consumer since: its own time.
            recovered.draining[version] = old_due if old_due is not None and version not in named else due
        self.record({"action": "recover", "interrupted": pending.get("action"), "primary": now,
                     "previous": previous, "candidate": candidate, "outcome": "recovered"})
        self.save(recovered)
        return recovered

    def point_consumers(self, version: int, router_split: dict[str, str] | None = None,
                        confirm_all: bool = False, standby: int | None = None) -> list[str]:
        """Every consumer serves `version` (pipelines keep `standby` warm beside it); returns the models whose
        config changed (confirmed with url).

        The live switch goes first: a pipeline that keeps `version` warm serves it from its next batch, and its
        reload (new config) is only waited for when it does not. `confirm_all`: also wait for the live consumers
        whose file is already right (after a crash, a config may have been written and never loaded)."""
        self.switch(version)
        planned = primary.plan(self.model, version, self.repositories, router_split, standby)
        changes = [c for c in planned if c.text != c.path.read_text()]
        # Only consumers the server runs now are waited for: one it has not loaded (explicit mode: the operator's
        # choice) reads the new config whenever it is loaded, and a rollout never loads it as a side effect.
        live = live_control.loaded(self.url, [c.name for c in planned]) if self.url else set()
        # A router in front of a pinned model names only loaded versions: loads, then routers, then unloads, each
        # phase in force before the next is written (without a server to ask, the router falls back by itself).
        steps = primary.phases(changes)
        started = time.monotonic()
        for number, phase in enumerate(steps):
            for change in phase:
                primary.write(self.store, [change])
                reached(f"consumer.{change.name}")
            if self.url and number < len(steps) - 1:
                self.confirm([c for c in phase if c.name in live])
        if self.url:
            waited = steps[-1] if steps else []
            if confirm_all:
                running = live_control.live_configs(self.url, [c.name for c in planned if c.name in live])
                waited = [c for c in planned if c in waited or not c.in_force(running.get(c.name, {}))]
            self.confirm([c for c in waited if c.name in live])
            self.timings["in force"] = time.monotonic() - started
        return [c.name for c in changes]

    def switch(self, version: int) -> None:
        """Pipelines that keep `version` warm serve it from their next batch; the others wait for their config."""
        primary.switch(self.store, self.model, version, primary.consumers(self.model, self.repositories))
        reached("switched")

    def confirm(self, changes: list) -> None:
        """Ask for each reload (explicit mode) and wait for it: the step is in force when the last one is."""
        started = time.monotonic()
        # One reload at a time: concurrent explicit loads of an ensemble and of models beside it were seen to
        # leave the ensemble on its old config (Triton reloads dependents from the config it read first).
        for change in changes:
            self.timings[change.name] = live_control.wait_config(self.url, change.name, change.in_force,
                                                                 key=self.key)
            if change.pinned_version is not None:
                # The new version is loaded; it is in force once the old one no longer takes new requests.
                self.timings[change.name] += live_control.wait_serving(self.url, change.name, change.pinned_version)
        self.timings["in force"] = time.monotonic() - started

    def wait_loaded(self, version: int) -> None:
        """A pinned model loads `version` only once its config names it (point_consumers waits for that)."""
        if self.url and not self.pinned():
            live_control.wait_version_ready(self.url, self.model, version, key=self.key)

    def restore(self, version: int) -> None:
        self.store.restore(self.model, version)
        reached("restored")

    def make_primary(self, state: RolloutState, version: int, clear_candidate: bool = True) -> None:
        """`version` is what every consumer serves now: the primary before becomes `previous`, the previous before
        drains (at once, unless a consumer may still run it) and, with `clear_candidate`, so does the candidate."""
        old_previous, old_until, old_candidate = state.previous, state.previous_until, state.candidate
        state.primary, state.previous = version, state.primary
        state.previous_until = time.time() + self.drain_seconds
        state.draining.pop(version, None)
        self.drain(state, [old_previous], max(0.0, old_until - time.time()))
        if clear_candidate or old_candidate == version:
            state.candidate = None
            self.drain(state, [old_candidate], self.drain_seconds)

    def drain(self, state: RolloutState, versions: Iterable[int | None], seconds: float) -> None:
        """Retire these versions (unless a role keeps them) once `seconds` have passed."""
        due = time.time() + seconds
        for version in versions:
            if version is not None and version not in state.roles():
                state.draining[version] = due

    def retire_drained(self, state: RolloutState, wait: bool = True) -> list[int]:
        """Retire the folders whose drain time passed (and folders no step keeps, such as pre-rollout ones);
        never one that a consumer's config names, whatever the state says. With `url` and `wait`, versions due
        within SETTLE_SECONDS are waited for and retired too."""
        now = time.time()
        soon = [due - now for due in state.draining.values() if 0 < due - now <= SETTLE_SECONDS]
        if self.url and wait and soon:
            time.sleep(max(soon))
            now = time.time()
        keep = state.roles() | {v for v, due in state.draining.items() if due > now} | self.named_by_consumers()
        retired = []
        for version in self.store.served(self.model):
            if version not in keep:
                self.store.retire(self.model, version)
                reached("retired")
                retired.append(version)
        state.draining = {v: due for v, due in state.draining.items() if due > now}
        if retired and self.url:
            for version in retired:
                live_control.wait_version_gone(self.url, self.model, version, key=self.key)
        return retired

    def named_by_consumers(self) -> set[int]:
        """The versions the consumers' configs serve: as primary, or as risk_router's candidate."""
        named = {c.version for c in primary.consumers(self.model, self.repositories)} - {None}
        candidate = _router_candidate(self)
        return named | ({candidate} if candidate is not None else set())


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


def _router_candidate(rollout: Rollout) -> int | None:
    """The version of this model that risk_router's split names as its candidate, if any."""
    for consumer in primary.consumers(rollout.model, rollout.repositories):
        if consumer.kind == primary.ROUTER_KIND:
            params = triton_config.backend_parameters(config_cache.load(consumer.path.parent))
            candidate = params.get("candidate", {}).get("string_value", "").strip()
            if candidate and Target.parse(candidate).model == rollout.model:
                return Target.parse(candidate).version
    return None


def _router_split_of(rollout: Rollout) -> dict[str, str] | None:
    """Clear risk_router's split when its candidate is a version of this model."""
    return dict(primary.NO_SPLIT) if _router_candidate(rollout) is not None else None


def promote(rollout: Rollout, version: int) -> int:
    """`version` becomes the primary on every path in one step; the split is cleared; the old primary stays loaded."""
    if not rollout.explicit_primary():
        raise RolloutError(f"{rollout.model}: promotion needs `version_policy: {{ all: {{}} }}` (or pinned "
                           "versions: `{ specific: { versions: [ ... ] } }`) in its config (with a `latest` policy the "
                           "newest folder is always the primary)")
    with rollout.step() as state:
        if version == state.primary:
            raise RolloutError(f"{rollout.model} version {version} is the primary already")
        _require_served(rollout, version, "promote")
        rollout.begin(state, {"action": "promote", "version": version, "from": state.primary})
        rollout.wait_loaded(version)
        rollout.point_consumers(version, dict(primary.NO_SPLIT), standby=state.primary)
        rollout.make_primary(state, version)
        rollout.retire_drained(state)
    return version


@dataclass(frozen=True)
class RollbackPlan:
    """A rollback, as planned (what the operator confirms) and as done."""

    action: str  # "abort": retire the candidate; "revert": serve an earlier version
    primary: int  # the version served before
    target: int  # the version served once done
    retiring: tuple[int, ...]  # versions that stop serving
    restoring: bool = False  # the target comes back from the retired area

    def describe(self, model: str) -> str:
        if self.action == "abort":
            return f"{model}: abort the canary of version {self.retiring[0]}; version {self.primary} stays primary"
        return f"{model}: serve version {self.target} instead of {self.primary}"


def rollback_plan(rollout: Rollout, to: int | None) -> RollbackPlan:
    store = rollout.store
    served = store.served(rollout.model)
    if rollout.explicit_primary():
        state = rollout.recovered_state()
        current, previous, candidate = state.primary, state.previous, state.candidate
    else:
        # The newest folder serves: going back means retiring it (and any other folder newer than the target).
        current = served[-1] if served else None
        older = [v for v in served if current is not None and v < current]
        previous, candidate = (older[-1] if older else None), None
    if current is None:
        raise RolloutError(f"{rollout.model} has no version in {rollout.repository}")
    if to is None:
        if candidate is not None:
            return RollbackPlan("abort", current, current, (candidate,))
        if previous is None:
            raise RolloutError(f"{rollout.model} has only version {current} loaded; there is nothing to roll back "
                               "to (name one with --to)")
        to = previous
    elif to == current:
        raise RolloutError(f"{rollout.model} version {to} is already served")
    elif to not in served and to not in store.retired(rollout.model):
        known = sorted(set(served) | set(store.retired(rollout.model)))
        raise RolloutError(f"{rollout.model} has no version {to} (known: {', '.join(map(str, known))})")
    if rollout.explicit_primary():
        retiring = (current,)
    else:
        retiring = tuple(sorted((v for v in served if v > to), reverse=True))
    return RollbackPlan("revert", current, to, retiring, to not in served)


def rollback(rollout: Rollout, expected: RollbackPlan) -> RollbackPlan:
    """Carry out `expected` (what the operator confirmed); refused if the rollout moved on since."""
    to = expected.target if expected.action == "revert" else None
    with rollout.step() as state:
        done = rollback_plan(rollout, to)
        if done != expected:
            raise RolloutError(f"the rollout changed since it was planned (now: {done.describe(rollout.model)})")
        rollout.begin(state, {"action": "rollback", "from": done.primary, "to": done.target,
                              "aborted": done.action == "abort", "retiring": list(done.retiring),
                              "restoring": done.restoring})
        if done.restoring:
            rollout.restore(done.target)
        if not rollout.explicit_primary():
            # Newest first: at every moment the newest folder left is one that was served before.
            for version in done.retiring:
                rollout.store.retire(rollout.model, version)
                reached("retired")
            if rollout.url:
                live_control.apply(rollout.url, rollout.model, done.target, key=rollout.key)
        elif done.action == "abort":
            rollout.point_consumers(state.primary, _router_split_of(rollout), standby=state.previous)
            state.candidate = None
            rollout.drain(state, done.retiring, rollout.drain_seconds)
            rollout.retire_drained(state)
        else:
            state.draining.pop(done.target, None)
            # The target is the previous primary, which pipelines keep warm: the switch alone puts it in force, so it
            # comes before anything that waits on the server (the router and the ensemble need the target loaded).
            rollout.switch(done.target)
            rollout.wait_loaded(done.target)
            rollout.point_consumers(done.target, dict(primary.NO_SPLIT))
            old = [state.primary, state.candidate]
            state.primary, state.previous, state.candidate = done.target, None, None
            rollout.drain(state, old, rollout.drain_seconds)
            # A rollback is the command in a hurry: the version it demoted drains, and the next command retires it.
            rollout.retire_drained(state, wait=False)
    return done


def router_of(rollout: Rollout) -> str | None:
    """The served model whose `primary` names this model and that splits its traffic (risk_router, llm_router)."""
    return next((c.name for c in primary.consumers(rollout.model, rollout.repositories)
                 if c.kind == primary.ROUTER_KIND), None)


def canary(rollout: Rollout, version: int | None, canary_percent: float, shadow_percent: float,
           candidate_repositories: tuple[Path, ...] = ()):
    """The model's router splits between the primary and `version` (None: no split). Returns the RoutingSettings.

    A pinned model (llm) loads the candidate before its router names it, and unloads it once the router no
    longer does (`point_consumers`); its streams finish on the version they started on."""
    router = router_of(rollout)
    pinned = rollout.keeps_state() and rollout.pinned()
    if pinned and router is None:
        raise RolloutError(f"{rollout.model} serves the newest version its config lists and has no router in "
                           "front of it: no canary; `promote` or `rollback` it")
    if pinned and shadow_percent:
        raise RolloutError(f"{rollout.model}: no shadow for a generating model (a mirrored generation costs a "
                           "whole one); use --percent")
    candidate = None if version is None else Target(rollout.model, version)
    managed = rollout.keeps_state()
    with rollout.step() as state:
        if managed and version is not None:
            if version == state.primary:
                raise RolloutError(f"{rollout.model} version {version} is the primary; a canary needs another")
            if state.candidate is not None and version != state.candidate:
                raise RolloutError(f"{rollout.model} version {state.candidate} is the candidate; promote it or "
                                   "roll it back first")
        settings, change = canary_config.split_change(rollout.repository, candidate, canary_percent, shadow_percent,
                                                      candidate_repositories, router or canary_config.ROUTER)
        rollout.begin(state, {"action": "canary", "model": change.name, "scorer": rollout.model,
                              "split": settings.describe()})
        if pinned:
            rollout.point_consumers(state.primary, change.parameters, standby=state.previous)
        else:
            primary.write(rollout.store, [change])
            reached(f"consumer.{change.name}")
            if rollout.url:
                rollout.confirm([change])
        if managed and version is not None:
            state.candidate = version
            state.draining.pop(version, None)
        if managed:
            rollout.retire_drained(state)
    return settings
