"""A router's split as a config change: its routing parameters rewritten in config.pbtxt, validated.

The router of a model is the served model whose `primary` names it (s2t/control/primary.py): risk_router for
risk_scorer, llm_router for llm; a candidate from another repository (a GPU scorer) goes through risk_router.

The step that writes it (under the control lock, recorded first) is `canary` in s2t/control/rollout.py.

Only the value of each routing line changes (the file keeps its comments); the result is parsed with Triton's
schema and validated before it replaces the config in one rename. Triton then reloads the router: by itself
in poll mode, on `load` in explicit mode, the old instance serving until the new one is ready.
"""
from __future__ import annotations

from pathlib import Path

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.routing.routing_policy import RoutingSettings, Target
from s2t import triton_config
from s2t.control.config_edit import ConfigEditError, set_string_parameter
from s2t.control.primary import ConfigChange
from s2t.control.version_store import VersionStore
from s2t.errors import S2TError

ROUTER = "risk_router"


class CanaryError(S2TError):
    pass


def _split_lines(candidate: Target | None, canary_percent: float, shadow_percent: float) -> dict[str, str]:
    return {"candidate": str(candidate) if candidate else "", "canary_percent": f"{canary_percent:g}",
            "shadow_percent": f"{shadow_percent:g}"}


def split_change(repository: Path, candidate: Target | None, canary_percent: float = 0.0,
                 shadow_percent: float = 0.0, candidate_repositories: tuple[Path, ...] = (), router: str = ROUTER
                 ) -> tuple[RoutingSettings, ConfigChange]:
    """The router's config with this split, validated; nothing is written.

    `candidate_repositories`: where else the candidate may live (model_repository_gpu holds the GPU scorers,
    which the router calls by name like any other model the server serves)."""
    store = VersionStore(Path(repository))
    path = store.model_dir(router) / "config.pbtxt"
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
            text = set_string_parameter(text, key, value, f"{router}/config.pbtxt")
        config = triton_config.load_text(text, str(path))
        settings = read_parameters(RoutingSettings, triton_config.backend_parameters(config))
    except (ConfigEditError, ValueError) as err:
        raise CanaryError(str(err)) from None
    return settings, ConfigChange(router, path, text, parameters=lines)
