"""`s2t canary`: set risk_router's split live, by rewriting its routing parameters in config.pbtxt.

Only the value of each routing line changes (the file keeps its comments); the result is parsed with Triton's
schema and validated before it replaces the config in one rename. Triton then reloads the router: by itself
in poll mode, on `load` in explicit mode, the old instance serving until the new one is ready.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from backends.routing_policy import RoutingSettings, Target
from tools import model_config
from tools.version_store import VersionStore

ROUTER = "risk_router"


class CanaryError(Exception):
    pass


def _set_parameter(text: str, key: str, value: str) -> str:
    pattern = re.compile(r'(parameters:\s*\{\s*key:\s*"' + re.escape(key) + r'"\s*value:\s*\{\s*string_value:\s*")'
                         r'([^"]*)(")')
    new, count = pattern.subn(lambda m: m.group(1) + value + m.group(3), text)
    if count != 1:
        raise CanaryError(f"{ROUTER}/config.pbtxt has {count} lines for parameter {key!r}; expected one")
    return new


def _split_lines(candidate: Target | None, canary_percent: float, shadow_percent: float) -> dict[str, str]:
    return {"candidate": str(candidate) if candidate else "", "canary_percent": f"{canary_percent:g}",
            "shadow_percent": f"{shadow_percent:g}"}


def split_parameters(settings: RoutingSettings) -> dict[str, str]:
    """The routing parameters as `set_split` writes them for this split (what a reloaded router reports)."""
    return _split_lines(settings.candidate, settings.canary_percent, settings.shadow_percent)


def set_split(repository: Path, candidate: Target | None, canary_percent: float = 0.0,
              shadow_percent: float = 0.0, candidate_repositories: tuple[Path, ...] = ()) -> RoutingSettings:
    """`candidate_repositories`: where else the candidate may live (model_repository_gpu holds the GPU scorers,
    which the router calls by name like any other model the server serves)."""
    store = VersionStore(Path(repository))
    path = store.model_dir(ROUTER) / "config.pbtxt"
    if not path.is_file():
        raise CanaryError(f"{path} not found")
    if candidate is not None:
        if candidate.version is None:
            raise CanaryError("name the candidate's version (MODEL VERSION)")
        holders = [VersionStore(Path(r)) for r in (repository, *candidate_repositories)]
        holder = next((h for h in holders if (h.model_dir(candidate.model) / "config.pbtxt").is_file()), store)
        if candidate.version not in holder.served(candidate.model):
            raise CanaryError(f"{candidate.model} has no version {candidate.version} in {holder.repository} "
                              f"(versions: {', '.join(map(str, holder.served(candidate.model))) or 'none'})")
    text = path.read_text()
    for key, value in _split_lines(candidate, canary_percent, shadow_percent).items():
        text = _set_parameter(text, key, value)
    staged = store.staging / f"{ROUTER}-config.pbtxt.{os.getpid()}"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_text(text)
    try:
        config = model_config.load_text(text, str(path))
        settings = RoutingSettings.from_parameters(model_config.backend_parameters(config))
    except ValueError as err:
        staged.unlink()
        raise CanaryError(str(err)) from None
    os.rename(staged, path)
    store.record({"action": "canary", "model": ROUTER, "split": settings.describe()})
    return settings
