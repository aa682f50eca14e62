"""The one place that says which version of a scorer is the primary, in every model that serves it.

A consumer is a served model that picks a scorer version for its callers:
- a router (risk_router, llm_router): parameter `primary` (`risk_scorer:N`, `llm:N`), beside its canary split;
- a pipeline model with parameters `scorer_model` / `scorer_version` (the version it loads) and, when it has
  one, `standby_scorer_version` (the version it keeps warm beside it: the previous primary, which a rollback goes
  back to by the live switch alone);
- an ensemble with a step calling the scorer (that step's `model_version`);
- the model itself when its config pins its versions (`version_policy: { specific: { versions: [ ... ] } }`, as
  `llm`): the newest version listed is the primary (callers that name no version get it); an older one listed
  beside it is the standby, the previous primary kept loaded so that a rollback to it loads nothing.
The primary is always written as an explicit version, never "the newest folder", so a staged candidate that is
loaded beside it gets no primary traffic.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from s2t.backends.routing.routing_policy import Target
from s2t import triton_config
from s2t.control import config_cache
from s2t.control.config_edit import replace_config, set_pinned_versions, set_step_version, set_string_parameter
from s2t.control.version_store import VersionStore
from s2t.atomic_files import write_atomically
from s2t.backends.runtime.repository_layout import live_switch_file

ROUTER_KIND, PIPELINE_KIND, ENSEMBLE_KIND, PINNED_KIND = "router", "pipeline", "ensemble", "pinned"
# What risk_router's split looks like with no candidate.
NO_SPLIT = {"candidate": "", "canary_percent": "0", "shadow_percent": "0"}


@dataclass(frozen=True)
class Consumer:
    name: str
    path: Path  # its config.pbtxt
    kind: str
    version: int | None  # the scorer version it serves now; None: the newest Triton loaded
    keeps_standby: bool = False  # a pipeline with a standby_scorer_version parameter


@dataclass(frozen=True)
class ConfigChange:
    """A new config for a live model, and what the live server's config must show once it runs it."""

    name: str
    path: Path
    text: str
    parameters: dict[str, str] = field(default_factory=dict)
    step_versions: dict[str, int] = field(default_factory=dict)
    # A pipeline: in force once the live instance keeps this version warm (configured or standby); the live
    # switch, written before any config, makes it the one that answers.
    warm_version: int | None = None
    # A pinned model: in force once the live config loads these versions, the newest of them serving.
    pinned_versions: tuple[int, ...] = ()

    @property
    def pinned_version(self) -> int | None:
        return max(self.pinned_versions, default=None)

    def in_force(self, live: dict) -> bool:
        """`live`: the model's config as Triton's HTTP API returns it (JSON)."""
        if self.pinned_versions:
            versions = live.get("version_policy", {}).get("specific", {}).get("versions", [])
            return sorted(int(v) for v in versions) == list(self.pinned_versions)
        params = live.get("parameters", {})
        if any(params.get(k, {}).get("string_value") != v for k, v in self.parameters.items()):
            return False
        if self.warm_version is not None and str(self.warm_version) not in {
                params.get(k, {}).get("string_value", "").strip() for k in ("scorer_version", "standby_scorer_version")}:
            return False
        steps = {s.get("model_name"): int(s.get("model_version", -1))
                 for s in live.get("ensemble_scheduling", {}).get("step", [])}
        return all(steps.get(m) == v for m, v in self.step_versions.items())


def _configs(repositories: Iterable[Path]):
    for repo in repositories:
        repo = Path(repo)
        if not repo.is_dir():
            continue
        for path in sorted(repo.glob("*/config.pbtxt")):
            yield path, config_cache.load(path.parent)


def consumers(model: str, repositories: Iterable[Path]) -> list[Consumer]:
    found = []
    for path, config in _configs(repositories):
        name = config.name or path.parent.name
        params = triton_config.backend_parameters(config)
        if name == model and pinned_version(config) is not None:
            found.append(Consumer(name, path, PINNED_KIND, pinned_version(config)))
        elif "primary" in params and params["primary"]["string_value"].strip():
            target = Target.parse(params["primary"]["string_value"])
            if target.model == model:
                found.append(Consumer(name, path, ROUTER_KIND, target.version))
        elif params.get("scorer_model", {}).get("string_value") == model:
            raw = params.get("scorer_version", {}).get("string_value", "").strip()
            found.append(Consumer(name, path, PIPELINE_KIND, int(raw) if raw else None,
                                  keeps_standby="standby_scorer_version" in params))
        elif config.platform == "ensemble":
            for step in config.ensemble_scheduling.step:
                if step.model_name == model:
                    found.append(Consumer(name, path, ENSEMBLE_KIND,
                                          None if step.model_version < 0 else int(step.model_version)))
    return found


def plan(model: str, version: int, repositories: Iterable[Path], router_split: dict[str, str] | None = None,
         standby: int | None = None) -> list[ConfigChange]:
    """The config of every consumer with `version` as the primary; `router_split` also resets risk_router's
    canary/shadow lines in the same file (a promotion clears the split in the one step that moves the primary);
    `standby`: the version pipelines keep warm beside it (the previous primary)."""
    changes = []
    found = consumers(model, repositories)
    routed = routed_candidate(model, found, router_split)
    for consumer in found:
        text = consumer.path.read_text()
        where = str(consumer.path)
        if consumer.kind == ROUTER_KIND:
            parameters = {"primary": f"{model}:{version}", **(router_split or {})}
            for key, value in parameters.items():
                text = set_string_parameter(text, key, value, where)
            changes.append(ConfigChange(consumer.name, consumer.path, text, parameters=parameters))
        elif consumer.kind == PIPELINE_KIND:
            text = set_string_parameter(text, "scorer_version", str(version), where)
            if consumer.keeps_standby:
                kept = "" if standby is None or standby == version else str(standby)
                text = set_string_parameter(text, "standby_scorer_version", kept, where)
                changes.append(ConfigChange(consumer.name, consumer.path, text, warm_version=version))
            else:
                changes.append(ConfigChange(consumer.name, consumer.path, text,
                                            parameters={"scorer_version": str(version)}))
        elif consumer.kind == PINNED_KIND:
            # Only an older standby can stay loaded: callers that name no version get the newest one loaded. A
            # candidate that a router's canary sends generations to is loaded too, whatever its number (callers of
            # the model itself that name no version get the newest; the split holds for the router's callers).
            versions = sorted({version} | ({standby} if standby is not None and standby < version else set())
                              | ({routed} if routed is not None else set()))
            text = set_pinned_versions(text, versions, where)
            changes.append(ConfigChange(consumer.name, consumer.path, text, pinned_versions=tuple(versions)))
        else:
            text = set_step_version(text, model, version, where)
            changes.append(ConfigChange(consumer.name, consumer.path, text, step_versions={model: version}))
    return changes


def routed_candidate(model: str, found: Iterable[Consumer], router_split: dict[str, str] | None) -> int | None:
    """The version of `model` a router's canary names once the split `router_split` is written (None: the split
    each router's config holds now)."""
    for consumer in found:
        if consumer.kind != ROUTER_KIND:
            continue
        if router_split is not None:
            text = router_split.get("candidate", "").strip()
        else:
            params = triton_config.backend_parameters(config_cache.load(consumer.path.parent))
            text = params.get("candidate", {}).get("string_value", "").strip()
        target = Target.parse(text) if text else None
        if target is not None and target.model == model:
            return target.version
    return None


def phases(changes: list[ConfigChange]) -> list[list[ConfigChange]]:
    """`changes` in the order that keeps every version a router names loaded: a pinned model first lists the
    versions it gains (loads them), then the routers switch, then it drops the versions it loses (unloads them,
    once their streams are done). One phase when no router takes part."""
    pinned = [c for c in changes if c.pinned_versions]
    others = [c for c in changes if not c.pinned_versions]
    if not pinned or not others:
        return [changes] if changes else []
    loads, unloads = [], []
    for change in pinned:
        listed = set(pinned_versions(config_cache.load(change.path.parent)))
        union = tuple(sorted(listed | set(change.pinned_versions)))
        if union == change.pinned_versions:
            loads.append(change)
            continue
        if set(union) != listed:
            loads.append(ConfigChange(change.name, change.path,
                                      set_pinned_versions(change.text, list(union), str(change.path)),
                                      pinned_versions=union))
        unloads.append(change)
    return [phase for phase in (loads, others, unloads) if phase]


def pinned_versions(config) -> tuple[int, ...]:
    """The versions a `specific` version policy lists (none for any other policy)."""
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") != "specific":
        return ()
    return tuple(sorted(int(v) for v in policy.specific.versions))


def pinned_version(config) -> int | None:
    """The primary of a model whose `specific` version policy lists its versions: the newest listed (what callers
    that name no version get); None for any other policy."""
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") != "specific" or not policy.specific.versions:
        return None
    return int(max(policy.specific.versions))


def switch(store: VersionStore, model: str, version: int, consumers_: Iterable[Consumer]) -> None:
    """Name `version` in the live switch of every pipeline that keeps a standby: the one it serves, if warm. A switch
    that names it already is left alone (a rollback switches before it waits on the server, then again with the
    other consumers)."""
    text = json.dumps({"scorer_model": model, "scorer_version": version}) + "\n"
    for consumer in consumers_:
        if consumer.keeps_standby:
            path = live_switch_file(store.repository, consumer.name)
            if _text_of(path) != text:
                write_atomically(path, text)


def _text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def write(store: VersionStore, changes: Iterable[ConfigChange]) -> None:
    for change in changes:
        replace_config(store, change.path, change.text)

