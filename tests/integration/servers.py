"""The one way the integration tests start a tritonserver of their own: on free ports, logging where the test
says, stopped within seconds. The session's shared servers (conftest.py) come from here too."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from s2t.serve.triton_server import TritonServer
from s2t.triton_admin import TritonAdmin, wait_until_ready

# The admin key of the session's explicit-mode server (conftest.py's `triton_explicit`).
EXPLICIT_ADMIN_KEY = "explicit-" + os.urandom(8).hex()


def triton_server(repositories, log_path: Path, **options) -> TritonServer:
    """Not started: `with` it (start, then stop), or call start()/stop(). `options` are TritonServer's. Its stop
    kills it (its stubs and shared memory reaped as after a crash) unless the test says `stop_gracefully=True`: only
    the tests of a clean stop wait for Triton's unload."""
    options.setdefault("exit_timeout_seconds", 5)
    options.setdefault("stop_gracefully", False)
    return TritonServer(list(repositories), free_port(), free_port(), free_port(), log_path=log_path, **options)


@contextmanager
def serving(server: TritonServer, timeout: float = 120):
    """`server` started (its log's tail printed when it fails to), stopped at the end."""
    try:
        server.start(timeout=timeout)
    except Exception:
        log = Path(server.log_path) if server.log_path else None
        print(log.read_text()[-5000:] if log and log.exists() else "no log")
        raise
    try:
        yield server
    finally:
        server.stop()


def wait_ready(server: TritonServer, timeout_s: float = 60) -> None:
    """A session server another module changed (a version published and retired, say) is ready again: Triton
    reports not ready while any version unloads."""
    assert wait_until_ready(TritonAdmin(server.http_url), lambda: server.process.poll() is None, timeout_s), \
        f"{server.http_url} not ready after {timeout_s:.0f} s"


def repository_copies(root: Path) -> tuple[Path, Path]:
    """Writable copies of model_repository and ensembles under `root`, for tests that publish, roll out or edit
    configs."""
    repo, ensembles = root / "model_repository", root / "ensembles"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ENSEMBLES, ensembles, ignore=shutil.ignore_patterns("__pycache__"))
    return repo, ensembles
