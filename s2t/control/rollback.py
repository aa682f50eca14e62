"""Serve an earlier version of a model whose newest folder is its primary (a `latest` version policy, such as
risk_scorer_lite): retire the newer version folders (or restore a retired one) in one rename each. Models with an
explicit primary (`version_policy: { all: {} }`) roll back through s2t/control/rollout.py instead.

With `latest { num_versions: 2 }` the previous version stays loaded, so rolling back to it needs no model load: Triton only stops routing to the retired version, which is why it is visible within
about a poll interval instead of the 2-4 s a cold load takes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from s2t.control.version_store import VersionStore


class RollbackError(Exception):
    pass


@dataclass(frozen=True)
class Rollback:
    model: str
    previous: int
    serving: int
    retired: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)


def plan(store: VersionStore, model: str, to: int | None) -> tuple[int, int]:
    served = store.served(model)
    if not served:
        raise RollbackError(f"{model} has no version in {store.repository}")
    current = served[-1]
    if to is None:
        older = [v for v in served if v < current]
        if not older:
            raise RollbackError(f"{model} has only version {current}; there is nothing to roll back to")
        return current, older[-1]
    if to == current:
        raise RollbackError(f"{model} version {to} is already served")
    if to not in served and to not in store.retired(model):
        known = sorted(set(served) | set(store.retired(model)))
        raise RollbackError(f"{model} has no version {to} (known: {', '.join(map(str, known))})")
    return current, to


def rollback(model: str, repository: Path, to: int | None = None) -> Rollback:
    """Make `to` (default: the version before the current one) the newest version folder of `model`."""
    store = VersionStore(Path(repository))
    if not (store.model_dir(model) / "config.pbtxt").is_file():
        raise RollbackError(f"{store.model_dir(model)} has no config.pbtxt")
    from s2t.gate.model_config import load
    from s2t.control.rollout import loads_every_folder
    if loads_every_folder(load(store.model_dir(model))):
        # Retiring the newer folders would pull a version out from under the consumers that serve it.
        raise RollbackError(f"{model} has an explicit primary (version_policy all): roll it back with "
                            "s2t.control.rollout (`s2t rollback`), which moves the consumers first")
    with store.lock():
        current, target = plan(store, model, to)
        restored = [] if target in store.served(model) else [target]
        # Newest first: at every moment the newest folder left is one that was served before.
        retired = sorted((v for v in store.served(model) if v > target), reverse=True)
        try:
            store.record({"action": "rollback", "model": model, "from": current, "to": target, "retired": retired,
                          "restored": restored})
        except OSError as err:
            raise RollbackError(f"cannot write the history ({err.strerror or err}); nothing was changed") from None
        for version in restored:
            store.restore(model, version)
        for version in retired:
            store.retire(model, version)
    return Rollback(model, current, target, retired, restored)
