"""Triton's HTTP health, model and repository API, as s2t's own processes call it (the supervisor, the keeper,
the server wrapper, the benchmarks, the commands' reachability check): one client, so each call has one timeout,
one set of headers and one error mapping. Standard library only: the keeper runs it from a release inside the serving image.

Operators' commands go through tritonclient (`s2t/control/live_control.py`); this is the in-process side.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable

# Where the key to Triton's restricted APIs (load/unload, index) comes from, for every command and the keeper.
ADMIN_KEY_ENV = "S2T_ADMIN_KEY"

# What a call to an unreachable, restarting or half-started server raises: a refused or reset connection, a
# timeout, or a body that is not JSON.
UNREACHABLE = (urllib.error.URLError, OSError, ValueError)
# Straight to the server, as tritonclient goes: a proxy named in the environment would answer for a server that is
# down, and would see the admin key.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TritonAdmin:
    def __init__(self, http_url: str, headers: dict[str, str] | None = None):
        """`http_url` is HOST:PORT; `headers` carry the admin key where the repository API is restricted."""
        self.http_url, self.headers = http_url, dict(headers or {})

    def _url(self, path: str) -> str:
        return f"http://{self.http_url}{path}"

    def _get_json(self, path: str, timeout_s: float):
        with _DIRECT.open(self._url(path), timeout=timeout_s) as response:
            return json.load(response)

    def _post(self, path: str, body: dict, timeout_s: float) -> bytes:
        request = urllib.request.Request(self._url(path), data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **self.headers})
        with _DIRECT.open(request, timeout=timeout_s) as response:
            return response.read()

    def check_live(self, timeout_s: float = 10.0) -> None:
        """Returns once the server answers its liveness URL with any status (it answered); raises one of UNREACHABLE
        when nothing does."""
        try:
            _DIRECT.open(self._url("/v2/health/live"), timeout=timeout_s).close()
        except urllib.error.HTTPError:
            pass

    def is_ready(self, timeout_s: float = 1.0) -> bool:
        """The server answers /v2/health/ready with 200; False while it cannot be reached or is not ready."""
        try:
            with _DIRECT.open(self._url("/v2/health/ready"), timeout=timeout_s) as response:
                return response.status == 200
        except UNREACHABLE:
            return False

    def is_version_ready(self, model: str, version: str, timeout_s: float = 2.0) -> bool | None:
        """True or False as Triton says; None when the server could not be asked."""
        try:
            with _DIRECT.open(self._url(f"/v2/models/{model}/versions/{version}/ready"),
                              timeout=timeout_s) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False
        except UNREACHABLE:
            return None

    def model_config(self, model: str, timeout_s: float = 10.0) -> dict:
        """The configuration Triton serves the model with (its JSON form); raises one of UNREACHABLE."""
        return self._get_json(f"/v2/models/{model}/config", timeout_s)

    def model_stats(self, model: str, timeout_s: float = 10.0) -> list[dict]:
        """Triton's statistics of every loaded version of the model."""
        return self._get_json(f"/v2/models/{model}/stats", timeout_s)["model_stats"]

    def repository_index(self, timeout_s: float = 10.0) -> list[dict]:
        """Every model of the repositories with its version and state (READY, UNAVAILABLE, ...)."""
        return json.loads(self._post("/v2/repository/index", {}, timeout_s))

    def load(self, model: str, config: dict | None = None, timeout_s: float = 120.0) -> None:
        """Load (or reload) the model, with `config` in place of its config.pbtxt when given."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._post(f"/v2/repository/models/{model}/load", body, timeout_s)


def wait_until_ready(admin: TritonAdmin, running: Callable[[], bool], timeout_s: float,
                     poll_s: float = 0.2) -> bool:
    """True once the server is ready; False when `running()` turns false (the process died) or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running():
        if admin.is_ready():
            return True
        time.sleep(poll_s)
    return False
