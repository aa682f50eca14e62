"""Stub supervision for `s2t serve`: Triton 2.51 never restarts a python stub that died, so this does.

A stub that is gone while its model version still reports READY is dead (an intentional unload makes the
version unready; a reload starts the replacement stub before the old one exits). The supervisor then touches
that version's model file, which makes Triton load the version again: its poller does so by itself, and in
explicit mode the repository API's `load` follows (with unchanged files it does nothing; a touched config.pbtxt
with the same content is not enough either).
"""
from __future__ import annotations

import os
import py_compile
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tools.live_control import admin_headers

STUB_BINARY = "triton_python_backend_stub"
# A stub must be missing on this many consecutive checks before it counts as dead: a reload may briefly show
# neither the old stub nor its replacement.
MISSING_CHECKS = 2


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    version: str
    instance: str
    model_file: Path

    @property
    def key(self) -> tuple[str, str, str]:
        return self.model, self.version, self.instance


@dataclass(frozen=True)
class Restart:
    stub: Stub
    detected_at: float
    reloaded_at: float


def parse_stub(pid: int, argv: list[str]) -> Stub | None:
    """The python backend starts `stub MODEL_FILE SHM_REGION SIZE GROWTH PARENT_PID BACKEND_DIR IPC INSTANCE ...`."""
    if len(argv) < 9 or not argv[0].endswith(STUB_BINARY):
        return None
    model_file = Path(argv[1])
    model, instance = model_file.parent.parent.name, argv[8]
    if instance == model:
        # A short-lived stub the python backend starts to auto-complete the config while loading, not an instance.
        return None
    return Stub(pid, model, model_file.parent.name, instance, model_file)


def stubs_of(server_pid: int) -> dict[int, Stub]:
    found = {}
    for task in Path(f"/proc/{server_pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            stub = parse_stub(child, argv)
            if stub is not None:
                found[child] = stub
    return found


# After a reload is asked for, its stub may take this long to come up; meanwhile the same key is not judged again.
RELOAD_GRACE_SECONDS = 15.0


@dataclass
class DeathWatch:
    """The decision, apart from /proc and HTTP: which stubs of the last look are dead now."""

    missing: dict[int, int] = field(default_factory=dict)
    known: dict[int, Stub] = field(default_factory=dict)
    reloading: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def update(self, current: dict[int, Stub], is_ready: Callable[[str, str], bool], now: float = 0.0) -> list[Stub]:
        alive_keys = {s.key for s in current.values()}
        for key in [k for k, until in self.reloading.items() if k in alive_keys or until <= now]:
            del self.reloading[key]
        dead = []
        for pid, stub in list(self.known.items()):
            if pid in current:
                continue
            if stub.key in alive_keys or stub.key in self.reloading or not is_ready(stub.model, stub.version):
                del self.known[pid]  # replaced, being reloaded, or unloaded on purpose
                self.missing.pop(pid, None)
                continue
            self.missing[pid] = self.missing.get(pid, 0) + 1
            if self.missing[pid] >= MISSING_CHECKS:
                dead.append(stub)
                self.reloading[stub.key] = now + RELOAD_GRACE_SECONDS
                del self.known[pid]
                del self.missing[pid]
        self.known.update(current)
        return dead


class StubSupervisor(threading.Thread):
    def __init__(self, server_pid: int, http_url: str, explicit: bool, admin_key: str | None = None,
                 interval: float = 0.2, log: Callable[[str], None] | None = None):
        super().__init__(name="s2t-stub-supervisor", daemon=True)
        self.server_pid, self.http_url, self.explicit, self.admin_key = server_pid, http_url, explicit, admin_key
        self.interval = interval
        self.restarts: list[Restart] = []
        self._watch = DeathWatch()
        self._stop_event = threading.Event()
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)

    def start(self) -> None:
        # The first look before returning: a stub that dies right after start-up is known and so noticed.
        self._watch.update(stubs_of(self.server_pid), self._is_ready, time.monotonic())
        super().start()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - supervision must outlive one bad look
                self._log(f"s2t supervisor: check failed: {err}")

    def check(self) -> list[Restart]:
        done = []
        for stub in self._watch.update(stubs_of(self.server_pid), self._is_ready, time.monotonic()):
            detected = time.monotonic()
            self._log(f"s2t supervisor: stub {stub.instance} of {stub.model} version {stub.version} "
                      f"(pid {stub.pid}) died; loading it again")
            self._reload(stub)
            restart = Restart(stub, detected, time.monotonic())
            self.restarts.append(restart)
            done.append(restart)
        return done

    def _is_ready(self, model: str, version: str) -> bool:
        url = f"http://{self.http_url}/v2/models/{model}/versions/{version}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _reload(self, stub: Stub) -> None:
        # Triton reloads a version whose files changed; with unchanged files a `load` does nothing at all.
        os.utime(stub.model_file)
        if stub.model_file.suffix == ".py":
            # Current bytecode, or the new stub rewrites __pycache__ and poll mode reloads the model once more.
            py_compile.compile(str(stub.model_file))
        if not self.explicit:
            return
        request = urllib.request.Request(f"http://{self.http_url}/v2/repository/models/{stub.model}/load",
                                         data=b"{}", method="POST",
                                         headers=admin_headers(self.admin_key or ""))
        with urllib.request.urlopen(request, timeout=60):
            pass

