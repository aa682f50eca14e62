"""`s2t status`: what is served, from the repositories, the control area and (with `url`) the live server.

Per model: its version folders and their role (primary, previous, candidate, draining), what the live server
reports for each version (READY, UNAVAILABLE, ...), the primary every consumer serves, each router's split
(risk_router, llm_router), risk_router's breaker state, the supervisor's restarts (`supervisor.json` in the control
area, when the supervisor writes one) and the last history lines.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.routing.routing_policy import RoutingSettings
from s2t import triton_config
from s2t.control import primary
from s2t.control.live_control import admin_headers
from s2t.control.rollout import Rollout, default_consumer_repositories, loads_every_folder
from s2t.control.version_store import VersionStore, version_numbers
from s2t.prometheus_text import samples_named, scrape

SUPERVISOR_FILE = "supervisor.json"
# The supervisor's last events in the table (`--json` has all it keeps).
SUPERVISOR_EVENTS_SHOWN = 5
ROUTER = "risk_router"


def _configs(repositories: Iterable[Path]) -> dict[str, tuple[Path, object]]:
    found = {}
    for repo in repositories:
        for path in sorted(Path(repo).glob("*/config.pbtxt")):
            config = triton_config.load(path.parent)
            found[config.name or path.parent.name] = (path.parent, config)
    return found


def _live_versions(url: str, names: Iterable[str]) -> dict[str, dict[str, str]]:
    """model -> {version: state}: the repository index (explicit mode needs the admin key), else readiness."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    client = http.InferenceServerClient(url, network_timeout=10)
    try:
        try:
            index = client.get_model_repository_index(headers=admin_headers())
            states: dict[str, dict[str, str]] = {}
            for entry in index:
                if entry.get("version"):
                    states.setdefault(entry["name"], {})[entry["version"]] = entry.get("state", "")
            return states
        except InferenceServerException:
            pass  # the restricted API refused us: ask each model instead
        states = {}
        for name in names:
            try:
                states[name] = {v: "READY" for v in client.get_model_metadata(name).get("versions", [])}
            except InferenceServerException:
                states[name] = {}
        return states
    finally:
        client.close()


def _breaker_state(metrics_url: str | None) -> str:
    if not metrics_url:
        return "unknown"
    try:
        metrics = scrape(metrics_url, timeout_s=5)
    except OSError:
        return "unknown"
    states = [labels.get("state") for labels, value in samples_named(metrics, "s2t_router_breaker_state") if value == 1]
    return states[0] if states and states[0] else "unknown"


def default_metrics_url(url: str | None) -> str | None:
    """Triton's usual layout: HTTP on port N, metrics on N + 2."""
    if not url or ":" not in url:
        return None
    host, _, port = url.rpartition(":")
    return f"http://{host}:{int(port) + 2}/metrics" if port.isdigit() else None


def collect(repository: Path, consumer_repositories: tuple[Path, ...] = (), url: str | None = None,
            metrics_url: str | None = None, history_lines: int = 5) -> dict:
    store = VersionStore(Path(repository))
    repositories = (Path(repository), *(consumer_repositories or default_consumer_repositories(repository)))
    configs = _configs(repositories)
    live = _live_versions(url, configs) if url else {}
    models = {}
    for name, (model_dir, config) in configs.items():
        entry: dict = {"platform": config.platform or config.backend}
        roles: dict[int, str] = {}
        if (model_dir.parent.resolve() == Path(repository).resolve() and config.platform != "ensemble"
                and (loads_every_folder(config) or primary.pinned_version(config) is not None)):
            state = Rollout(name, repository, consumer_repositories).state()
            for role in ("primary", "previous", "candidate"):
                entry[role] = getattr(state, role)
                if getattr(state, role) is not None:
                    roles.setdefault(getattr(state, role), role)
            for version in state.draining:
                roles.setdefault(version, "draining")
            entry["consumers"] = {c.name: c.version for c in primary.consumers(name, repositories)}
        folders = version_numbers(model_dir)
        versions = sorted(set(folders) | {int(v) for v in live.get(name, {}) if v.isdigit()})
        entry["versions"] = [{"version": v, "role": roles.get(v, ""), "folder": v in folders,
                              **({"state": live.get(name, {}).get(str(v), "not loaded")} if url else {})}
                             for v in versions]
        parameters = triton_config.backend_parameters(config)
        if "primary" in parameters and "canary_percent" in parameters:  # a router: risk_router, llm_router
            entry["split"] = read_parameters(RoutingSettings, parameters).describe()
        if name == ROUTER:
            entry["breaker"] = _breaker_state(metrics_url or default_metrics_url(url)) if url else "unknown"
        models[name] = entry
    supervisor = store.control / SUPERVISOR_FILE
    return {"models": models,
            "supervisor": json.loads(supervisor.read_text()) if supervisor.is_file() else None,
            "history": store.history()[-history_lines:] if history_lines else []}


def _when(epoch: float, now: float) -> str:
    """ISO time (UTC) and how long ago, for a person reading the table."""
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    return f"{iso} ({_age(now - epoch)} ago)"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def supervisor_lines(record: dict, now: float, events_shown: int = SUPERVISOR_EVENTS_SHOWN) -> list[str]:
    """supervisor.json as lines: the server, its restarts, reloads by model and reason, the last events."""
    started = record.get("started_at")
    restarts = record.get("server_restarts", 0)
    lines = [f"supervisor: server pid {record.get('server_pid') or 'unknown'}"
             + (f", supervising since {_when(started, now)}" if started else "")
             + f", {restarts} server restart{'' if restarts == 1 else 's'}"
             + (f" ({record['server_hangs']} after a hang)" if record.get("server_hangs") else "")]
    reloads = record.get("reloads", [])
    lines.append("  reloads: " + (", ".join(f"{r['model']} ({r['reason']}) x{r['count']}" for r in reloads)
                                  or "none"))
    if record.get("reload_failures"):
        lines.append("  failed reloads: " + ", ".join(f"{m} x{n}" for m, n in record["reload_failures"].items()))
    if record.get("given_up"):
        lines.append("  given up (failing, not reloaded again; the other models keep serving): "
                     + ", ".join(record["given_up"]))
    events = record.get("events", [])[-events_shown:] if events_shown else []
    for event in events:
        words = [event.get("event", ""), event.get("model", ""), event.get("reason", ""), event.get("detail", "")]
        lines.append(f"  {_when(event['at'], now)} " + " ".join(w for w in words if w))
    return lines


def table(status: dict) -> str:
    lines = []
    for name, entry in status["models"].items():
        versions = ", ".join(
            f"{v['version']}" + (f" {v['role']}" if v["role"] else "") + (f" {v['state']}" if "state" in v else "")
            + ("" if v["folder"] else " (no folder)") for v in entry["versions"]) or "none"
        lines.append(f"{name:<18} {entry['platform']:<16} versions: {versions}")
        if entry.get("consumers"):
            lines.append(f"{'':<18} served as primary by: "
                         + ", ".join(f"{c}:{v if v is not None else 'newest'}" for c, v in entry["consumers"].items()))
        if "split" in entry:
            lines.append(f"{'':<18} split: {entry['split']}"
                         + (f"; breaker: {entry['breaker']}" if "breaker" in entry else ""))
    if status["supervisor"] is not None:
        lines += supervisor_lines(status["supervisor"], time.time())
    if status["history"]:
        lines.append("history:")
        for event in status["history"]:
            rest = {k: v for k, v in event.items() if k not in ("at", "by", "action", "model", "parity", "checks",
                                                                "artifact", "sha256")}
            lines.append(f"  {event.get('at', '')} {event.get('action', '')} {event.get('model', '')} "
                         + " ".join(f"{k}={v}" for k, v in sorted(rest.items())))
    return "\n".join(lines)
