"""Tell the live server about a changed repository and wait until it serves the intended version.

Poll mode: Triton notices by itself; this only watches. Explicit mode: the repository API's `load` re-reads the
model's folder (versions whose files did not change stay loaded), through the restricted-API key when the
server was started with one (`S2T_ADMIN_KEY`).
"""
from __future__ import annotations

import os
import time

from s2t.triton_admin import ADMIN_KEY_ENV

ADMIN_HEADER = "admin-key"
_POLL_MODE_REFUSAL = "polling is enabled"
RELOAD_RETRY_SECONDS = 2.0


def _refused() -> type[Exception]:
    """What tritonclient raises when the server says no: imported with its client, once a step first asks the
    server (tritonclient imports numpy, which a rollback's live switch does not wait for)."""
    from tritonclient.utils import InferenceServerException

    return InferenceServerException


def admin_headers(key: str | None = None) -> dict[str, str]:
    key = key if key is not None else os.environ.get(ADMIN_KEY_ENV)
    return {ADMIN_HEADER: key} if key else {}


def served_version(client, model: str) -> int | None:
    """The version a request without a version gets: the newest ready one."""
    try:
        versions = client.get_model_metadata(model).get("versions", [])
    except _refused():
        return None
    return max((int(v) for v in versions), default=None)


def loaded(url: str, models: list[str], timeout: float = 10.0) -> set[str]:
    """Which of `models` the live server has loaded now (in explicit mode the operator chose them)."""
    import tritonclient.http as http

    client = http.InferenceServerClient(url, network_timeout=timeout)
    try:
        found = set()
        for model in models:
            try:
                if client.is_model_ready(model):
                    found.add(model)
            except _refused():
                pass
        return found
    finally:
        client.close()


def live_configs(url: str, models: list[str], timeout: float = 10.0) -> dict[str, dict]:
    """The config each of `models` runs with now (as Triton's HTTP API returns it); absent if it has none."""
    import tritonclient.http as http

    client = http.InferenceServerClient(url, network_timeout=timeout)
    try:
        found = {}
        for model in models:
            try:
                found[model] = client.get_model_config(model)
            except _refused():
                pass
        return found
    finally:
        client.close()


def _load_and_wait(url: str, model: str, done, what: str, timeout: float, key: str | None) -> float:
    """Ask for a (re)load where the mode allows it, then poll `done(client)`; seconds until it held."""
    import tritonclient.http as http

    started = time.monotonic()
    client = http.InferenceServerClient(url, network_timeout=timeout)
    try:
        if done(client):
            return time.monotonic() - started  # nothing to load: a reload would only start a new stub
        explicit = _request_load(client, model, key)
        asked = time.monotonic()
        while not done(client):
            now = time.monotonic()
            if now - started > timeout:
                raise TimeoutError(f"{model} does not {what} after {timeout:.0f} s")
            if explicit and now - asked > RELOAD_RETRY_SECONDS:
                # A load of a model this one depends on makes Triton reload it too, from the config it read
                # then; a request of ours that arrives during that reload can be merged into it, so ask again.
                _request_load(client, model, key)
                asked = now
            time.sleep(0.01)
    finally:
        client.close()
    return time.monotonic() - started


def _request_load(client, model: str, key: str | None) -> bool:
    """Ask for a load; False in poll mode (Triton refuses: it loads by itself)."""
    try:
        client.load_model(model, headers=admin_headers(key))
    except _refused() as err:
        if _POLL_MODE_REFUSAL not in str(err):
            raise
        return False
    return True


def apply(url: str, model: str, version: int, timeout: float = 30.0, key: str | None = None) -> float:
    """Seconds from the call until `model` serves `version` (requests without a version get it)."""
    return _load_and_wait(url, model, lambda client: served_version(client, model) == version,
                          f"serve version {version}", timeout, key)


def wait_serving(url: str, model: str, version: int, timeout: float = 60.0) -> float:
    """Seconds until requests without a version get `version`, asking for no load (the config is in force)."""
    import tritonclient.http as http

    started = time.monotonic()
    client = http.InferenceServerClient(url, network_timeout=timeout)
    try:
        while served_version(client, model) != version:
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{model} does not serve version {version} after {timeout:.0f} s")
            time.sleep(0.01)
    finally:
        client.close()
    return time.monotonic() - started


def wait_version_ready(url: str, model: str, version: int, timeout: float = 60.0, key: str | None = None) -> float:
    """Seconds until `version` of `model` is loaded and ready (whether or not it is the newest)."""
    return _load_and_wait(url, model, lambda client: _ready(client, model, version),
                          f"load version {version}", timeout, key)


def wait_version_gone(url: str, model: str, version: int, timeout: float = 60.0, key: str | None = None) -> float:
    """Seconds until `version` of `model` no longer serves (its folder was retired)."""
    return _load_and_wait(url, model, lambda client: not _ready(client, model, version),
                          f"unload version {version}", timeout, key)


def wait_config(url: str, model: str, in_force, timeout: float = 60.0, key: str | None = None) -> float:
    """Seconds until the live `model` is ready and `in_force(its config as JSON)` holds."""
    def done(client) -> bool:
        try:
            return in_force(client.get_model_config(model)) and client.is_model_ready(model)
        except _refused():
            return False
    return _load_and_wait(url, model, done, "run the new config", timeout, key)


def _ready(client, model: str, version: int) -> bool:
    try:
        return client.is_model_ready(model, str(version))
    except _refused():
        return False
