"""Model supervision: Triton 2.51 never restarts a python stub that died, nor a model that keeps failing, nor an
execute that never returns, so this reloads the models, with backoff and a cap, aborts a hung server, and records
what it did.

Two signs of a sick model: its stub is gone while its version still reports READY (an intentional unload makes
the version unready; a reload starts the replacement stub before the old one exits), or more than 10% of its
requests failed in the model itself (Triton's failure counter with reason BACKEND) for 5 s in a row. A request
answered with its own error (an invalid record, an unknown route, anything a caller got wrong) is not a failure of
the model and never counts: no caller can make the supervisor reload or replace anything.
A reload is, in explicit mode, the repository API's `load` with the live config plus a changed `s2t_reload`
parameter (a `load` of unchanged files does nothing, and the repository may be read-only), fetched and posted
under the control lock that every rollout step holds while it rewrites configs and waits for their loads: a
config fetched before a promote and posted after it would undo the promote. In poll mode, touching
the version's model file (a stub's, or for a model without a stub, such as the in-process backend's, the files of
its ready versions in the repository), which Triton's poller takes for a new model. A reload that fails is tried
again after 1, 2, 4 ... 30 s; after 5 heals of one model in a row the model is given up: reported (the
`s2t_supervisor_given_up` gauge, supervisor.json, `s2t status`) while the other models keep serving. The server is
replaced only when it is dead or hung: a dead stub that no reload can bring back (poll mode on a read-only
repository) calls `on_replace`, and an execute stuck past the hang bound (the in-process backend's
`s2t_execute_started_seconds` gauge) aborts the server with SIGABRT, so that faulthandler and Triton leave their
stacks in the log, and whoever keeps it (`s2t serve`, the container's keeper) starts a new one.

Standard library only: the NGC container runs it on its system Python.
"""
from __future__ import annotations

import errno
import os
import py_compile
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from typing import Callable

from s2t.prometheus_text import scrape
from s2t.triton_admin import UNREACHABLE, TritonAdmin
from s2t.serve import stub_command
from s2t.serve.healing import (ErrorRateSettings, ErrorRateWatch, HangSettings, HealPolicy, HealSettings,
                               SupervisorState, request_counters, stuck_executes)

# A stub must be missing on this many consecutive checks before it counts as dead: a reload may briefly show
# neither the old stub nor its replacement.
MISSING_CHECKS = 2
# After a reload is asked for, its stub may take this long to come up; past it a still missing stub is dead again.
RELOAD_GRACE_SECONDS = 15.0
# Triton's counters are read this often for the error-rate watch.
METRICS_INTERVAL_SECONDS = 1.0
RELOAD_PARAMETER = "s2t_reload"
# A rollout step holds the control lock for seconds (its loads); past this the reload is tried again later.
CONTROL_LOCK_SECONDS = 60.0
# A hung server gets this long after SIGABRT to write its stacks and die before it is killed outright.
ABORT_GRACE_SECONDS = 5.0


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
class Heal:
    model: str
    reason: str
    stub: Stub | None
    detected_at: float
    reloaded_at: float


def parse_stub(pid: int, argv: list[str]) -> Stub | None:
    """The model instance whose stub `pid` is; None for other processes and for the stub that completes a config."""
    command = stub_command.parse(argv)
    if command is None or command.instance is None or command.completes_config:
        return None
    return Stub(pid, command.model, command.version, command.instance, command.model_file)


def stubs_of(server_pid: int) -> dict[int, Stub]:
    """Every stub of the server: the children of each of its threads (a few hundred)."""
    return _stubs(_children_by_thread(server_pid, None))


def _children_by_thread(server_pid: int, threads: list[str] | None) -> dict[str, list[int]]:
    """The children of `threads` of the server (all of them when None), by thread; threads without any left out."""
    folder = f"/proc/{server_pid}/task"
    if threads is None:
        try:
            threads = os.listdir(folder)
        except OSError:
            return {}
    found = {}
    for thread in threads:
        try:
            with open(f"{folder}/{thread}/children") as listing:
                children = listing.read().split()
        except OSError:
            continue
        if children:
            found[thread] = [int(child) for child in children]
    return found


def _stubs(children_by_thread: dict[str, list[int]]) -> dict[int, Stub]:
    found = {}
    for children in children_by_thread.values():
        for child in children:
            try:
                argv = stub_command.command_line(child)
            except OSError:
                continue
            stub = parse_stub(child, argv)
            if stub is not None:
                found[child] = stub
    return found


class StubFinder:
    """The server's stubs, looked for several times a second at little cost. Reading the children of each of the
    server's few hundred threads took milliseconds of CPU per look (several percent of a core, all the time);
    the stubs are forked by one or two of them. A look reads only the threads that had children at the last full
    look, and looks at every thread again when a stub it knew is not among them (a reload may fork the new stub
    from another thread) and at least every `full_look_seconds` (a stub forked by another thread is known within
    that)."""

    def __init__(self, server_pid: int, full_look_seconds: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.server_pid, self.full_look_seconds, self.clock = server_pid, full_look_seconds, clock
        self._forking: list[str] = []
        self._last_full_look = float("-inf")

    def find(self, known: dict[int, Stub]) -> dict[int, Stub]:
        now = self.clock()
        if now - self._last_full_look < self.full_look_seconds:
            found = _stubs(_children_by_thread(self.server_pid, self._forking))
            if all(pid in found for pid in known):
                return found
        by_thread = _children_by_thread(self.server_pid, None)
        self._forking, self._last_full_look = list(by_thread), now
        return _stubs(by_thread)


@dataclass
class DeathWatch:
    """The decision, apart from /proc and HTTP: which stubs of the last look are dead now.

    `is_ready` answers True, False (unloaded on purpose) or None (the server did not answer in time: judge later).
    """

    missing: dict[int, int] = field(default_factory=dict)
    known: dict[int, Stub] = field(default_factory=dict)
    reloading: dict[tuple[str, str, str], tuple[float, Stub]] = field(default_factory=dict)

    def update(self, current: dict[int, Stub], is_ready: Callable[[str, str], bool | None],
               now: float = 0.0) -> list[Stub]:
        alive_keys = {s.key for s in current.values()}
        dead = []
        for key, (until, stub) in list(self.reloading.items()):
            if key in alive_keys:
                del self.reloading[key]
            elif until <= now:
                del self.reloading[key]
                if is_ready(stub.model, stub.version):
                    dead.append(stub)  # the reload did not bring it back
                    self.reloading[key] = (now + RELOAD_GRACE_SECONDS, stub)
        for pid, stub in list(self.known.items()):
            if pid in current:
                self.missing.pop(pid, None)  # dead means missing on consecutive looks, not twice in its life
                continue
            if stub.key in alive_keys or stub.key in self.reloading:
                self._forget(pid)  # replaced, or being reloaded
                continue
            ready = is_ready(stub.model, stub.version)
            if ready is None:
                continue
            if not ready:
                self._forget(pid)  # unloaded on purpose
                continue
            self.missing[pid] = self.missing.get(pid, 0) + 1
            if self.missing[pid] >= MISSING_CHECKS:
                dead.append(stub)
                self.reloading[stub.key] = (now + RELOAD_GRACE_SECONDS, stub)
                self._forget(pid)
        self.known.update(current)
        return dead

    def _forget(self, pid: int) -> None:
        self.known.pop(pid, None)
        self.missing.pop(pid, None)


class CannotReload(OSError):
    """No retry can succeed (poll mode on a read-only repository): only a new server brings the model back."""


class Reloader:
    """Asks Triton for a new instance of a model; raises OSError (urllib's errors included) when it cannot.

    `control_lock(timeout)`: the rollout commands' lock (VersionStore.lock of the served repository).
    `config_fetched(model)`, when set, is called between fetching the live config and posting it (tests)."""

    def __init__(self, http_url: str, explicit: bool, admin_headers: dict[str, str] | None = None,
                 control_lock: Callable[[float], AbstractContextManager] | None = None):
        self.http_url, self.explicit, self.admin_headers = http_url, explicit, admin_headers or {}
        self.admin = TritonAdmin(http_url, self.admin_headers)
        self.control_lock = control_lock or (lambda timeout: nullcontext())
        self.config_fetched: Callable[[str], None] | None = None

    def reload(self, model: str, model_files: list[Path]) -> None:
        if self.explicit:
            self._load_with_new_config(model)
            return
        if not model_files:
            raise CannotReload(f"no model file of {model} known to touch")
        for model_file in model_files:
            # Triton's poller reloads a version whose files changed.
            try:
                os.utime(model_file)
            except OSError as err:
                if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise CannotReload(f"{model_file}: {err.strerror}") from None
                raise
            if model_file.suffix == ".py":
                # Current bytecode, or the new stub rewrites __pycache__ and poll mode reloads the model once more.
                try:
                    py_compile.compile(str(model_file), doraise=True)
                except py_compile.PyCompileError as err:
                    raise OSError(str(err)) from None

    def _load_with_new_config(self, model: str) -> None:
        with ExitStack() as held:
            try:
                held.enter_context(self.control_lock(CONTROL_LOCK_SECONDS))
            except OSError:
                pass  # a control area that cannot be written (a read-only mount): no rollout can take it either
            except Exception as err:  # noqa: BLE001 - the lock's timeout: a step holds it; tried again later
                raise OSError(f"cannot take the control lock: {err}") from None
            self._post_live_config(model)

    def _post_live_config(self, model: str) -> None:
        config = self.admin.model_config(model)
        if self.config_fetched is not None:
            self.config_fetched(model)
        config.setdefault("parameters", {})[RELOAD_PARAMETER] = {"string_value": f"{time.time():.6f}"}
        self.admin.load(model, config)


class StubSupervisor(threading.Thread):
    """`on_give_up(model)`: told when a model is given up (it stays reported; nothing is replaced for it).
    `on_replace(why)`: the server must be replaced (a dead stub no reload can bring back in it).
    `repositories`: where the models' folders are, for a poll-mode reload of a model that has no stub."""

    def __init__(self, server_pid: int, http_url: str, explicit: bool, admin_headers: dict[str, str] | None = None,
                 metrics_url: str | None = None, state: SupervisorState | None = None,
                 heal_settings: HealSettings | None = None, error_settings: ErrorRateSettings | None = None,
                 on_give_up: Callable[[str], None] | None = None, interval: float = 0.2,
                 log: Callable[[str], None] | None = None,
                 control_lock: Callable[[float], AbstractContextManager] | None = None,
                 on_replace: Callable[[str], None] | None = None, hang_settings: HangSettings | None = None,
                 repositories: list[Path] | tuple[Path, ...] = ()):
        super().__init__(name="s2t-stub-supervisor", daemon=True)
        self.server_pid, self.http_url, self.metrics_url = server_pid, http_url, metrics_url
        self.interval = interval
        self.reloader = Reloader(http_url, explicit, admin_headers, control_lock)
        self.state = state or SupervisorState()
        self.heals: list[Heal] = []
        self._watch = DeathWatch()
        self._errors = ErrorRateWatch(error_settings or ErrorRateSettings())
        self._policy = HealPolicy(heal_settings or HealSettings())
        self._hang = hang_settings or HangSettings()
        self._on_give_up = on_give_up
        self._on_replace = on_replace
        self._repositories = [Path(r) for r in repositories]
        self._aborted = False
        self._stubs: dict[int, Stub] = {}
        self._finder = StubFinder(server_pid)
        self._last_metrics = 0.0
        self._platforms: dict[str, str] = {}
        self._model_files: dict[str, set[Path]] = {}
        self._stop_event = threading.Event()
        self._log = log or (lambda message: print(message, file=sys.stderr, flush=True))

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(5)

    def start(self) -> None:
        # The first look before returning: a stub that dies right after start-up is known and so noticed.
        self._look()
        self._watch.update(self._stubs, self._is_ready, time.monotonic())
        self.state.server_started(self.server_pid)
        # One that died before this look left no process to miss: find it by its ready model without a stub.
        for model in self._ready_without_stub():
            self._log(f"s2t supervisor: {model} is ready but has no stub")
            self._heal(model, "stub_died", None)
        super().start()

    def _ready_without_stub(self) -> list[str]:
        try:
            index = self.reloader.admin.repository_index()
        except UNREACHABLE:
            return []
        with_stub = {s.model for s in self._stubs.values()}
        missing = []
        for entry in index:
            name = entry.get("name")
            if entry.get("state") != "READY" or name in with_stub or name in missing:
                continue
            try:
                config = self.reloader.admin.model_config(name, timeout_s=5)
            except UNREACHABLE:
                continue
            # Python models and Python-based backends (`runtime: model.py`) run in stubs; others never do.
            if config.get("backend") == "python" or config.get("runtime", "").endswith(".py"):
                missing.append(name)
        return missing

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.check()
            except Exception as err:  # noqa: BLE001 - supervision must outlive one bad look
                self._log(f"s2t supervisor: check failed: {err}")

    def check(self) -> list[Heal]:
        now = time.monotonic()
        self._look()
        done = []
        for stub in self._watch.update(self._stubs, self._is_ready, now):
            self._log(f"s2t supervisor: stub {stub.instance} of {stub.model} version {stub.version} "
                      f"(pid {stub.pid}) died")
            done += self._heal(stub.model, "stub_died", stub)
        if self.metrics_url and now - self._last_metrics >= METRICS_INTERVAL_SECONDS and not self._aborted:
            self._last_metrics = now
            try:
                metrics = scrape(f"http://{self.metrics_url}/metrics", timeout_s=2)
            except UNREACHABLE:
                metrics = None
            if metrics is not None and self._abort_if_hung(metrics):
                return done
            for model, rate in self._failing_models(metrics, now) if metrics is not None else ():
                self._log(f"s2t supervisor: {model} failed {rate:.0%} of its requests for "
                          f"{self._errors.settings.seconds:.0f} s")
                done += self._heal(model, "error_rate", None)
        for model, reason in self._policy.due(time.monotonic()):
            done += self._heal(model, reason, None)
        return done

    def _look(self) -> None:
        # Every stub still watched, the suspects included: one a look missed (the children files are best effort
        # while the server's threads come and go) is looked for on every thread again, never taken as gone.
        self._stubs = self._finder.find(self._watch.known)
        # Remembered past a stub's death: a retry must know what to touch when no stub of the model is left.
        for stub in self._stubs.values():
            self._model_files.setdefault(stub.model, set()).add(stub.model_file)

    def _heal(self, model: str, reason: str, stub: Stub | None) -> list[Heal]:
        detected = time.monotonic()
        decision = self._policy.ask(model, reason, detected)
        if decision == "later":
            return []
        if decision == "give_up":
            self._give_up(model, reason, f"{self._policy.settings.max_attempts} reloads in a row did not heal it")
            return []
        try:
            self.reloader.reload(model, sorted(self._model_files.get(model, ())) or self._version_files(model))
        except CannotReload as err:
            self.state.record("reload_failed", model, reason, str(err))
            self._give_up(model, reason, f"it cannot be reloaded in this server ({err})")
            if reason == "stub_died" and self._on_replace is not None:
                # A dead process no reload can bring back: only a new server serves the model again.
                self._on_replace(f"{model}'s stub died and cannot be reloaded in this server ({err})")
            return []
        except (OSError, ValueError) as err:
            self._policy.failed(model, reason, time.monotonic())
            self.state.record("reload_failed", model, reason, str(err))
            self._log(f"s2t supervisor: reloading {model} failed ({err}); trying again in "
                      f"{self._policy.delay(self._policy.attempts(model)):.1f} s")
            return []
        self._errors.forget(model)
        self.state.record("reload", model, reason)
        self._log(f"s2t supervisor: {model} reloaded ({reason}, attempt {self._policy.attempts(model)})")
        heal = Heal(model, reason, stub, detected, time.monotonic())
        self.heals.append(heal)
        return [heal]

    def _give_up(self, model: str, reason: str, why: str) -> None:
        if model in self.state.given_up:
            return
        self._log(f"s2t supervisor: giving {model} up: {why}")
        self.state.record("gave_up", model, reason, why)
        if self._on_give_up is not None:
            self._on_give_up(model)

    def _abort_if_hung(self, metrics) -> bool:
        """SIGABRT to a server whose execute is stuck past the bound (then SIGKILL after a grace); True if so."""
        stuck = stuck_executes(metrics, time.time(), self._hang)
        if not stuck:
            return False
        worst = max(stuck, key=lambda s: s.seconds)
        self._aborted = True
        why = f"{worst.instance}'s execute has not returned for {worst.seconds:.1f} s (bound {self._hang.seconds:g} s)"
        self._log(f"s2t supervisor: tritonserver is hung: {why}; aborting it")
        self.state.record("server_hung", worst.model, "hung", why)
        try:
            os.kill(self.server_pid, signal.SIGABRT)
        except ProcessLookupError:
            return True
        threading.Thread(target=self._kill_after_grace, name="s2t-abort-grace", daemon=True).start()
        return True

    def _kill_after_grace(self) -> None:
        deadline = time.monotonic() + ABORT_GRACE_SECONDS
        while time.monotonic() < deadline:
            if not _alive(self.server_pid):
                return
            time.sleep(0.1)
        try:
            os.kill(self.server_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _version_files(self, model: str) -> list[Path]:
        """The files of the model's ready versions in the repositories: what a poll-mode reload of a model without
        a stub touches."""
        files = []
        for repository in self._repositories:
            folder = repository / model
            if not folder.is_dir():
                continue
            for version in sorted(v for v in folder.iterdir() if v.is_dir() and v.name.isdigit()):
                if self._is_ready(model, version.name):
                    files += sorted(f for f in version.iterdir() if f.is_file())
        return files

    def _failing_models(self, metrics, now: float) -> list[tuple[str, float]]:
        counters = request_counters(metrics)
        self.state.watch(set(counters))
        # An ensemble only passes its members' failures on: reloading it heals nothing.
        return self._errors.observe({m: c for m, c in counters.items() if not self._is_ensemble(m)}, now)

    def _is_ensemble(self, model: str) -> bool:
        if model not in self._platforms:
            try:
                self._platforms[model] = self.reloader.admin.model_config(model, timeout_s=2).get("platform", "")
            except UNREACHABLE:
                return True  # unknown for now: not judged this round
        return self._platforms[model] == "ensemble"

    def _is_ready(self, model: str, version: str) -> bool | None:
        return self.reloader.admin.is_version_ready(model, version)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
