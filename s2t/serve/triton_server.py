"""The embedded tritonserver 2.51.0 from the nvidia-pytriton wheel: backend directory, environment, process.

The wheel ships the server binary, the python backend and one stub per Python version; the stub finds this
virtual environment through `python3` on PATH and loads the interpreter's own libpython through
LD_LIBRARY_PATH. The backend directory is assembled per server from the wheel plus `backends/`, the stub behind a
wrapper that starts it without the server's descriptors (STUB_WRAPPER). The public gRPC port is the gRPC front's
(s2t/serve/grpc_front.py); Triton's own gRPC endpoint listens on a loopback port behind it.
"""
from __future__ import annotations

import collections
import compileall
import fcntl
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import s2t.backends.runtime
from s2t.serve.healing import STATE_FILE, HangSettings, SupervisorState
from s2t.serve import leftovers
from s2t.serve import server_hook
from s2t.serve.grpc_front import (DEFAULT_MAX_CALLS, READY_ANSWER, SERVER_READY, GrpcFront, GrpcFrontError,
                                  in_process_env)
from s2t.serve.hidden_args import HiddenArgumentError
from s2t.serve import http_front
from s2t.serve.keeper import reap_group, spawn
from s2t.serve.request_limits import grpc_max_message_bytes
from s2t.serve.restricted_apis import restrict
from s2t.control.live_control import admin_headers
from s2t.serve.supervisor import StubSupervisor
from s2t.control.version_store import VersionStore
from s2t.triton_admin import TritonAdmin, wait_until_ready
from s2t.errors import S2TError
from s2t.triton_config import INPROCESS_BACKEND

# Located, not imported: importing pytriton pulls in its client (aiohttp, tritonclient.http.aio), most of
# `s2t serve`'s start-up CPU before tritonserver is even launched.
PYTRITON_DIR = Path(importlib.util.find_spec("pytriton").origin).resolve().parent
TRITON_DIR = PYTRITON_DIR / "tritonserver"
TRITON_LIBS = PYTRITON_DIR.parent / "nvidia_pytriton.libs"
# A checkout's backends/runtime/ or the installed package's: both hold the Python-based backends' model.py.
PROJECT_BACKENDS = Path(s2t.backends.runtime.__file__).resolve().parent
# Built native code (native/*.sh): the in-process backend per Python version and the gRPC front.
NATIVE_BUILD = Path(__file__).resolve().parent / "native"
# Python-based backends: folders of backends/runtime/ holding a model.py that Triton runs as `runtime: model.py`.
PYTHON_BASED_BACKENDS = ("onnxruntime",)
# Native backends (native/): Triton's backend name -> the library, built by `make native` in a checkout and by the
# wheel's build in an installed package. The in-process one links this Python's library: one build per version.
NATIVE_BACKENDS = {INPROCESS_BACKEND: NATIVE_BUILD / f"python{sys.version_info.major}.{sys.version_info.minor}"
                   / f"libtriton_{INPROCESS_BACKEND}.so"}


MODEL_LOAD_THREADS = 16
# How often Triton refreshes its CPU and memory gauges (its default: 2,000 ms).
METRICS_INTERVAL_MS = 500
# Triton's latency summaries, when asked for: the median within five percentiles and the p99 (which the p99 alert rule
# and dashboard panel read) within one, between the 98th and the 100th. Triton's own default set costs more.
LATENCY_QUANTILES = "0.5:0.05,0.99:0.01"


def wait_reaches_triton(public_port: int, timeout_s: float) -> bool:
    """Whether a ServerReady call through the front is answered ready within `timeout_s`. Triton opens its gRPC
    port moments after HTTP says ready, and the front's connection to it may be waiting to try again: once this
    call is answered, the next ones are too."""
    # Here, not in s2t/serve/grpc_front.py: the keeper imports that module in images without grpcio.
    import grpc
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"localhost:{public_port}") as channel:
        ready = channel.unary_unary(SERVER_READY)
        while time.monotonic() < deadline:
            try:
                if ready(b"", timeout=max(0.1, deadline - time.monotonic())) == READY_ANSWER:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    return False


def latency_summary_args(quantiles: str | None) -> list[str]:
    """tritonserver's options for its latency summaries with `quantiles` (`q:error,...`; None: Triton's own set)."""
    return ["--metrics-config=summary_latencies=true",
            *([f"--metrics-config=summary_quantiles={quantiles}"] if quantiles else [])]


LATENCY_SUMMARY_ARGS = latency_summary_args(LATENCY_QUANTILES)
# How long after HTTP says ready a call through the gRPC front may take to be answered.
GRPC_FRONT_REACH_S = 10.0


def _reap_when_dead(process: subprocess.Popen) -> None:
    """The server's stubs killed the moment it exits, however it exits (an abort included), by whoever started
    it: no stub outlives its server, even when nothing calls `stop`."""
    process.wait()
    reap_group(process.pid)


class ServerError(S2TError, RuntimeError):
    pass


# What the python backend runs as its stub (`bash -c "exec .../python/triton_python_backend_stub ARGS"`, in a
# fork of tritonserver): the wheel's stub, without the server's descriptors. Triton forks stubs without closing
# them, so a stub forked after the server began serving (any reload) held its listening sockets and client
# connections for its whole life: a connection the server closed stayed open for its client, a dead server's
# clients waited on connections nobody answered, and new connections could queue on a listener nobody accepts on.
# 0-2 are the log; this script's own (255, or the highest free below when the server holds 255) closes at the
# exec; the listing's own is closed by the time the loop runs. The stub talks to the server through shared memory
# named on its command line.
STUB_WRAPPER = """#!/bin/bash
for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    if (( fd > 2 )) && [[ -e /proc/$$/fd/$fd && ! /proc/$$/fd/$fd -ef $0 ]]; then exec {fd}>&-; fi
done
exec "${0%/*}/stub/triton_python_backend_stub" "$@"
"""


def assemble_backend_dir(dest: Path) -> Path:
    """python/ from the wheel with the stub for this interpreter, plus the project's Python-based backends and the
    native ones that are built (a model of a native backend that is not fails to load, Triton naming the library)."""
    python_dir = dest / "python"
    python_dir.mkdir(parents=True)
    wheel_backend = TRITON_DIR / "backends" / "python"
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(wheel_backend / name, python_dir / name)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = TRITON_DIR / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise ServerError(f"the wheel has no python backend stub for Python {version}")
    (python_dir / "stub").mkdir()
    shutil.copy2(stub, python_dir / "stub" / stub.name)
    wrapper = python_dir / stub.name
    wrapper.write_text(STUB_WRAPPER)
    wrapper.chmod(0o755)
    for backend in PYTHON_BASED_BACKENDS:
        (dest / backend).mkdir()
        shutil.copy2(PROJECT_BACKENDS / backend / "model.py", dest / backend / "model.py")
    for backend, library in NATIVE_BACKENDS.items():
        if library.is_file():
            (dest / backend).mkdir()
            shutil.copy2(library, dest / backend / library.name)
    return dest


# Ports handed out below the kernel's ephemeral range: one from bind(0) comes from that range, where any outgoing
# connection (a load generator's, a health poll's) may take it as its local port before the server binds it, and
# the server then exits with "address in use".
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()
# Shared by every process on the machine that hands out ports this way (two test workers, `s2t bench`, the commands
# they start): a port drawn is reserved by an exclusive lock on its file for RESERVATION_SECONDS, long enough for
# its server to bind it, so that two processes drawing at the same moment never give one port to two servers.
# Where the folder cannot be written, each process only remembers its own ports.
PORT_RESERVATIONS = Path(tempfile.gettempdir()) / "s2t-ports"
RESERVATION_SECONDS = 60.0
_reservations: collections.deque[tuple[float, int]] = collections.deque()


def ephemeral_floor(path: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel gives outgoing connections (Linux's default 32768 where unreadable)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(floor: int | None = None) -> int:
    """A port nothing is bound to now, below the ephemeral range, never handed out before by this process (two
    servers started together get different ports) nor by another process in the last RESERVATION_SECONDS; the
    server binds it moments later."""
    highest = (floor or ephemeral_floor()) - 1
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(LOWEST_PORT, highest)
        with _handed_out_lock:
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("0.0.0.0", port))
                except OSError:
                    continue
            if not _reserve(port):
                continue
            _handed_out.add(port)
            return port
    raise OSError(f"no free port between {LOWEST_PORT} and {highest}")


def _reserve(port: int) -> bool:
    """False if another process reserved `port` within RESERVATION_SECONDS; else it is reserved now. Reservations
    older than that are released (their servers have bound their ports, or never will)."""
    now = time.monotonic()
    while _reservations and now - _reservations[0][0] > RESERVATION_SECONDS:
        os.close(_reservations.popleft()[1])
    try:
        if not PORT_RESERVATIONS.is_dir():
            PORT_RESERVATIONS.mkdir(exist_ok=True)
            PORT_RESERVATIONS.chmod(0o1777)  # every user's ports in one place, each user's files their own
        fd = os.open(PORT_RESERVATIONS / str(port), os.O_CREAT | os.O_RDONLY, 0o644)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _reservations.append((now, fd))
    return True


def log_tail(path: Path, lines: int = 15) -> str:
    """A server log's last lines (read from its last 16 KiB), for an error that outlives the log's folder."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 16_384))
            return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(unreadable: {err.strerror})"


def precompile_models(repositories: list[Path]) -> None:
    """Write each python model's bytecode before Triton starts.

    A stub importing model.py writes __pycache__ into the version folder (it ignores PYTHONDONTWRITEBYTECODE), and in
    poll mode Triton takes that for a changed model and reloads it a second after start-up. Compiled beforehand,
    the cache is current and nothing is written. A read-only repository is fine: then the stub cannot write either.
    Bytecode that is already current is left as it is: rewriting it would make a poll-mode server already serving
    the same repository reload every python model.
    """
    for repository in repositories:
        for model_py in Path(repository).glob("*/[0-9]*/model.py"):
            compileall.compile_file(str(model_py), quiet=2)


def server_env() -> dict[str, str]:
    """The stubs run this venv's Python, where the project's package (`s2t`) is installed.
    (keeper.spawn leaves the admin key out.)"""
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(TRITON_LIBS), libdir, env.get("LD_LIBRARY_PATH")) if p)
    return env


@dataclass
class TritonServer:
    """One tritonserver process: `start()` returns once every model is ready, `stop()` drains and reaps."""

    repositories: list[Path]
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_control_mode: str = "poll"
    poll_seconds: int = 1
    exit_timeout_seconds: int = 30
    # The repository API (load/unload, index), shared memory, logging and trace answer only requests with header
    # `admin-key: <admin_key>`; without a key the last three answer nobody (restricted_apis.py).
    admin_key: str | None = None
    # Triton's rate limiter: at most this many executions hold a `cpu_slot` (see the leaf models' configs).
    rate_limit_slots: int | None = None
    # Reload a model whose python stub died or that keeps failing (Triton 2.51 does neither): see supervisor.py.
    supervise: bool = False
    # What the supervisor did; by default `supervisor.json` in the first repository's control area.
    supervisor_state: SupervisorState | None = None
    # Called (from the supervisor's thread) with a model the supervisor gave up on (reported; the server keeps serving).
    on_give_up: object = None
    # Called (from the supervisor's thread) with the reason when the server must be replaced: a dead stub that no
    # reload can bring back in it.
    on_replace: object = None
    # An execute that has not returned after this many seconds makes the supervisor abort the server as hung.
    hang_seconds: float = HangSettings.seconds
    # The public gRPC port is the gRPC front's, Triton's own endpoint on `triton_grpc_port` on loopback behind it. Off
    # only to measure the front against Triton's own endpoint: then Triton listens on `grpc_port` itself, and a
    # cancelled call can crash it.
    grpc_front: bool = True
    # The front inside tritonserver's process (ModelInfer through Triton's C API), or, with this, in a process of its
    # own, which relays every call and lives from the first start() to stop(), across the starts of a server kept
    # running (keep_grpc_front): while a new server starts, its port stays open and calls are refused UNAVAILABLE.
    grpc_front_process: bool = False
    # Upstream calls the front has in flight at most (None: grpc_front.DEFAULT_MAX_CALLS).
    grpc_max_calls: int | None = None
    triton_grpc_port: int | None = None
    # The public HTTP port is the HTTP front's, inside tritonserver's process (s2t/serve/http_front.py), Triton's own
    # endpoint on `triton_http_port` on loopback behind it. Off only to measure the front against Triton's own
    # endpoint: then Triton listens on `http_port` itself, and one request (classification of a BYTES output) can
    # kill it.
    http_front: bool = True
    triton_http_port: int | None = None
    # Triton's latency summaries (LATENCY_SUMMARY_ARGS): off, as `s2t serve` runs by default and the benchmarks measure.
    latency_summaries: bool = False
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    # stop(): SIGTERM and Triton's own drain and unload (about 3 s with the python models: it checks once a second),
    # or, off, the process group killed at once, its stubs and shared memory reaped as after a crash: for a server
    # that no caller uses any more (a bench's, once measured; a test's).
    stop_gracefully: bool = True
    process: subprocess.Popen | None = None
    front: GrpcFront | None = None
    _workdir: tempfile.TemporaryDirectory | None = None
    # The server process whose leftovers reap() has cleaned (a dead server's are cleaned once).
    _reaped_pid: int | None = None
    _log_file: object = None
    supervisor: StubSupervisor | None = None

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def triton_grpc_url(self) -> str:
        """Triton's own gRPC endpoint (behind the front, or the public one without it)."""
        return f"localhost:{self.triton_grpc_port or self.grpc_port}"

    def command(self, backend_dir: Path) -> list[str]:
        cmd = [str(TRITON_DIR / "bin" / "tritonserver")]
        cmd += [f"--model-repository={Path(r).resolve()}" for r in self.repositories]
        cmd += [
            f"--backend-directory={backend_dir}",
            *(["--http-address=127.0.0.1", f"--http-port={self.triton_http_port}"] if self.http_front
              else [f"--http-port={self.http_port}"]),
            f"--metrics-port={self.metrics_port}",
            # Triton's exit joins its metrics thread, which sleeps an interval between polls: at the default 2 s, a
            # stop waited a second on average for it. A poll reads /proc for the CPU and memory gauges (microseconds).
            f"--metrics-interval-ms={METRICS_INTERVAL_MS}",
            f"--model-control-mode={self.model_control_mode}",
            f"--exit-timeout-secs={self.exit_timeout_seconds}",
            "--strict-readiness=true",
            # Every config here is complete (s2t check-config proves it). With auto-completion on, the python backend
            # starts each model's stub twice (once to ask model.py for a config, then for the instance): measured,
            # start-up to all models ready went from 2.6-4.4 s to 1.0 s, and a risk_router reload (every canary,
            # promote and rollback step) from 1.5-1.9 s to 0.14-0.19 s.
            "--disable-auto-complete-config",
            # Load all models at once rather than four at a time: each load mostly waits on its stub starting.
            f"--model-load-thread-count={MODEL_LOAD_THREADS}",
            # The in-process backend's interpreter: this virtual environment's, as the stubs run.
            f"--backend-config={INPROCESS_BACKEND},python={sys.executable}",
        ]
        if self.grpc_front:
            cmd += ["--grpc-address=127.0.0.1", f"--grpc-port={self.triton_grpc_port}"]
        else:
            cmd.append(f"--grpc-port={self.grpc_port}")
        if self.model_control_mode == "poll":
            cmd.append(f"--repository-poll-secs={self.poll_seconds}")
        elif self.model_control_mode == "explicit":
            cmd.append("--load-model=*")
        if self.latency_summaries:
            cmd += LATENCY_SUMMARY_ARGS
        if self.rate_limit_slots:
            cmd += ["--rate-limit=execution_count", f"--rate-limit-resource=cpu_slot:{self.rate_limit_slots}"]
        return restrict(cmd + self.extra_args, self.admin_key)

    def start(self, timeout: float = 120.0) -> "TritonServer":
        front_was_running = self.front is not None and self.front.running()
        stdout = None
        if self.log_path is not None:
            self._log_file = open(self.log_path, "ab")
            stdout = self._log_file
        try:
            if self.grpc_front and self.triton_grpc_port is None:
                self.triton_grpc_port = free_port()
            if self.http_front and self.triton_http_port is None:
                self.triton_http_port = free_port()
            if self.grpc_front and self.grpc_front_process and not front_was_running:
                self._start_grpc_front(stdout)
            precompile_models(self.repositories)
            self._workdir = tempfile.TemporaryDirectory(prefix="s2t-triton-")
            backend_dir = assemble_backend_dir(Path(self._workdir.name) / "backends")
            # What a server that died before this one left (its stubs, its shared-memory regions) goes first.
            leftovers.clean_within(self.repositories)
            # Own process group: the stubs are reaped with the server, whatever happens to this process.
            command, env = self.command(backend_dir), server_env()
            if self.grpc_front and not self.grpc_front_process:
                env = self._in_process_front_env(env, command)
            else:
                env = self._guarded_env(env)
            if self.http_front:
                env = self._http_front_env(env, command)
            try:
                self.process = spawn(command, env, stdout)
            except HiddenArgumentError as err:
                raise ServerError(str(err)) from None
            threading.Thread(target=_reap_when_dead, args=(self.process,), name="s2t-server-reaper",
                             daemon=True).start()
            self.wait_ready(timeout)
            if self.grpc_front and not wait_reaches_triton(self.grpc_port, GRPC_FRONT_REACH_S):
                raise ServerError(f"the gRPC front on port {self.grpc_port} did not reach tritonserver's gRPC "
                                  f"endpoint on port {self.triton_grpc_port} within {GRPC_FRONT_REACH_S:.0f} s")
        except BaseException:
            self.stop(keep_grpc_front=front_was_running)
            raise
        if self.supervise:
            if self.supervisor_state is None:
                self.supervisor_state = SupervisorState(
                    path=VersionStore(Path(self.repositories[0])).control / STATE_FILE)
            self.supervisor = StubSupervisor(self.process.pid, self.http_url, self.model_control_mode == "explicit",
                                             admin_headers(self.admin_key or ""),
                                             metrics_url=f"localhost:{self.metrics_port}",
                                             state=self.supervisor_state, on_give_up=self.on_give_up,
                                             control_lock=VersionStore(Path(self.repositories[0])).lock,
                                             on_replace=self.on_replace, repositories=self.repositories,
                                             hang_settings=HangSettings(self.hang_seconds))
            self.supervisor.start()
        return self

    def _front_settings(self) -> tuple[int, int, int, int, int]:
        """The front's ports, message limit, call limit and drain (Triton's exit timeout and 5 s), either way."""
        return (self.grpc_port, self.triton_grpc_port, grpc_max_message_bytes(self.repositories),
                self.grpc_max_calls or DEFAULT_MAX_CALLS, self.exit_timeout_seconds + 5)

    def _in_process_front_env(self, env: dict[str, str], command: list[str]) -> dict[str, str]:
        """`env` for a tritonserver that runs the front inside its process (a missing build fails the start here)."""
        try:
            return in_process_env(env, *self._front_settings(), command)
        except GrpcFrontError as err:
            raise ServerError(str(err)) from None

    def _http_front_env(self, env: dict[str, str], command: list[str]) -> dict[str, str]:
        """`env` for a tritonserver that runs the HTTP front inside its process (a missing build fails the start)."""
        options = http_front.front_options(self.http_port, self.triton_http_port,
                                           http_front.max_body_bytes(self.repositories), self.exit_timeout_seconds + 5)
        try:
            return http_front.in_process_env(env, options, command)
        except http_front.HttpFrontError as err:
            raise ServerError(str(err)) from None

    @staticmethod
    def _guarded_env(env: dict[str, str]) -> dict[str, str]:
        """`env` with only the hook's guard preloaded (no front inside tritonserver)."""
        try:
            return server_hook.preloaded(env)
        except server_hook.ServerHookError as err:
            raise ServerError(str(err)) from None

    def _start_grpc_front(self, stdout) -> None:
        """Started before Triton: a missing or broken front fails the start before anything else runs. Its port for
        Triton is kept for the server's whole life, so that a front that stays up finds every new server."""
        self.front = GrpcFront(*self._front_settings())
        try:
            self.front.start(stdout)
        except GrpcFrontError as err:
            self.front = None
            raise ServerError(str(err) + (f"; see {self.log_path}" if self.log_path else "")) from None

    def restart_dead_grpc_front(self) -> int | None:
        """The exit code of a front that had died, after starting a new one; None while it runs (or without one)."""
        if not self.grpc_front or self.front is None or self.front.running():
            return None
        code = self.front.process.returncode
        self._start_grpc_front(self._log_file)
        return code

    def reap(self) -> None:
        """After the server died: kill the stubs it left behind (they stay in its process group), then remove the
        shared-memory regions nobody holds any more (a server that died unlinked none of its own). Once per server
        process, each wait bounded: a new server's start waits seconds at most on what the old one left."""
        if self.process is not None and self._reaped_pid != self.process.pid:
            self._reaped_pid = self.process.pid
            reap_group(self.process.pid)
            leftovers.wait_group_gone(self.process.pid)
            leftovers.clean_within(self.repositories)

    def wait_ready(self, timeout: float) -> None:
        if wait_until_ready(TritonAdmin(self.http_url), lambda: self.process.poll() is None, timeout):
            return
        if self.process.poll() is not None:
            # The log's last lines travel with the error: a caller's temporary folder may not outlive it.
            raise ServerError(f"tritonserver exited with code {self.process.returncode} before it was ready"
                              + (f"; see {self.log_path}, which ends:\n{log_tail(self.log_path)}"
                                 if self.log_path else ""))
        raise ServerError(f"tritonserver not ready after {timeout:.0f} s")

    def stop(self, timeout: float | None = None, keep_grpc_front: bool = False) -> int | None:
        """SIGTERM: Triton stops accepting, finishes in-flight requests, unloads models; then reap the group. Then the
        gRPC front, which relayed the answers Triton gave while it drained, unless kept for the next start."""
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        timeout = self.exit_timeout_seconds + 15 if timeout is None else timeout
        if self.process is not None and self.process.poll() is None:
            if self.stop_gracefully:
                self.process.send_signal(signal.SIGTERM)
            else:
                reap_group(self.process.pid)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                try:
                    self.process.wait(leftovers.GROUP_GONE_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass  # stuck in the kernel past SIGKILL: its group is reaped and a new server starts all the same
        self.reap()
        if not keep_grpc_front:
            self._stop_grpc_front()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return self.process.returncode if self.process is not None else None

    def _stop_grpc_front(self) -> None:
        if self.front is not None:
            self.front.stop()
            self.front = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
