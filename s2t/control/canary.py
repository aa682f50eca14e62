"""`s2t canary`: set risk_router's split live, by rewriting its routing parameters in config.pbtxt.

Only the value of each routing line changes (the file keeps its comments); the result is parsed with Triton's
schema and validated before it replaces the config in one rename. Triton then reloads the router: by itself
in poll mode, on `load` in explicit mode, the old instance serving until the new one is ready.
"""
from __future__ import annotations

from pathlib import Path

from backends.routing_policy import RoutingSettings, Target
from s2t.gate import model_config
from s2t.control.config_edit import ConfigEditError, replace_config, set_string_parameter
from s2t.control.primary import ConfigChange
from s2t.control.version_store import VersionStore

ROUTER = "risk_router"


class CanaryError(Exception):
    pass


def _split_lines(candidate: Target | None, canary_percent: float, shadow_percent: float) -> dict[str, str]:
    return {"candidate": str(candidate) if candidate else "", "canary_percent": f"{canary_percent:g}",
            "shadow_percent": f"{shadow_percent:g}"}


def split_parameters(settings: RoutingSettings) -> dict[str, str]:
    """The routing parameters as `set_split` writes them for this split (what a reloaded router reports)."""
    return _split_lines(settings.candidate, settings.canary_percent, settings.shadow_percent)


def split_change(repository: Path, candidate: Target | None, canary_percent: float = 0.0,
                 shadow_percent: float = 0.0, candidate_repositories: tuple[Path, ...] = ()
                 ) -> tuple[RoutingSettings, ConfigChange]:
    """The router's config with this split, validated; nothing is written.

    `candidate_repositories`: where else the candidate may live (model_repository_gpu holds the GPU scorers,
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
    lines = _split_lines(candidate, canary_percent, shadow_percent)
    try:
        for key, value in lines.items():
            text = set_string_parameter(text, key, value, f"{ROUTER}/config.pbtxt")
        config = model_config.load_text(text, str(path))
        settings = RoutingSettings.from_parameters(model_config.backend_parameters(config))
    except (ConfigEditError, ValueError) as err:
        raise CanaryError(str(err)) from None
    return settings, ConfigChange(ROUTER, path, text, parameters=lines)


def set_split(repository: Path, candidate: Target | None, canary_percent: float = 0.0,
              shadow_percent: float = 0.0, candidate_repositories: tuple[Path, ...] = ()) -> RoutingSettings:
    """Write the split (under the control lock, recorded first); the live router picks it up on its reload."""
    store = VersionStore(Path(repository))
    with store.lock():
        settings, change = split_change(repository, candidate, canary_percent, shadow_percent,
                                        candidate_repositories)
        store.record({"action": "canary", "model": ROUTER, "split": settings.describe()})
        replace_config(store, change.path, change.text)
    return settings
