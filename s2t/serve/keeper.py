"""Keeping tritonserver and its stubs as one unit: started in their own process group, dying with their keeper,
reaped together, restarted with backoff; and the container entry point that does the same under Docker or Kubernetes.

    python3 -m s2t.serve.keeper [--supervisor-port 8003] [--state-dir DIR] [--openai-port 9000] [--fronts DIR] \
        -- tritonserver ...

runs the command, supervises its models (s2t/serve/supervisor.py), serves the supervisor's counters on
`--supervisor-port` (/metrics), forwards SIGTERM/SIGINT (Triton drains), and exits when tritonserver does, after
reaping every stub: a stub never outlives its server. When the server must be replaced (a dead stub that no reload
can bring back in it; a hung server, which the supervisor aborts) it exits non-zero, so that the orchestrator
starts a fresh container. A model that keeps failing is reported, never a reason to replace the server. On the NGC
image's Python with what the python models import there (the request limits read the records' module), except
where a repository holds the language model: then, as `s2t serve --llm` does, it also serves the OpenAI-compatible
API (s2t/serve/openai_server.py, aiohttp: the image's `llm` target) on `--openai-port` once the server is ready, and
stops it after the server.

With `--fronts DIR` (the images set it) the public HTTP and gRPC ports the command names are those of the fronts built
into DIR from native/ (s2t/serve/http_front.py, grpc_front.py), inside tritonserver's process as under `s2t serve`:
Triton's own endpoints move to loopback ports behind them, so that what the fronts refuse never reaches them.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from s2t.serve import hidden_args, leftovers, restricted_apis
from s2t.serve.parent_death import die_with_parent
from s2t.serve.healing import STATE_FILE, HangSettings, SupervisorState, doubling_delay
from s2t.serve.restricted_apis import restrict
from s2t.control.version_store import VersionStore
from s2t.triton_admin import ADMIN_KEY_ENV, TritonAdmin, wait_until_ready

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# How often the orphan reaper looks for zombies among this process's children.
ORPHAN_REAP_INTERVAL_S = 0.5
# Written in a command (e.g. a Kubernetes manifest, as `$$(S2T_ADMIN_KEY)` so that the kubelet leaves it alone),
# replaced by the key from the keeper's environment and never shown on a command line.
ADMIN_KEY_REFERENCE = f"$({ADMIN_KEY_ENV})"
# Options whose value holds the admin key: kept off the command line (s2t/serve/hidden_args.py).
SECRET_OPTIONS = ("--http-restricted-api=", "--grpc-restricted-protocol=")
# The model the OpenAI-compatible API serves (s2t/serve/openai_server.py's MODELS); a repository that holds it is
# what `s2t serve --llm` adds. Named here, not imported: that module needs aiohttp, which only the llm image has.
OPENAI_MODEL = "llm"
DEFAULT_OPENAI_PORT = 9000
# Triton's options that place its own endpoints: with the fronts the keeper sets them, whatever the command said.
ENDPOINT_OPTIONS = ("--http-address=", "--http-port=", "--grpc-address=", "--grpc-port=")


def server_environment(env: dict[str, str]) -> dict[str, str]:
    """The server's and so every stub's environment, without the admin key (readable in /proc/PID/environ)."""
    return {k: v for k, v in env.items() if k != ADMIN_KEY_ENV}


def secret_indices(command: list[str]) -> set[int]:
    return {i for i, arg in enumerate(command) if arg.startswith(SECRET_OPTIONS)}


def spawn(command: list[str], env: dict[str, str], stdout=None) -> subprocess.Popen:
    """Its own process group (the stubs join it), dying with the process that started it, with the admin key
    neither on its command line nor in its stubs' environment. Call it from a thread that outlives the server:
    the kernel sends the death signal when the thread that forked it ends."""
    return hidden_args.popen(command, secret_indices(command), server_environment(env), preexec_fn=die_with_parent,
                             stdout=stdout, stderr=subprocess.STDOUT if stdout else None, start_new_session=True)


def with_admin_key(command: list[str], env: dict[str, str]) -> list[str]:
    """ADMIN_KEY_REFERENCE replaced by the key from the environment; an error when it is referenced but unset."""
    if not any(ADMIN_KEY_REFERENCE in arg for arg in command):
        return command
    key = env.get(ADMIN_KEY_ENV)
    if not key:
        raise SystemExit(f"the command refers to {ADMIN_KEY_REFERENCE} but {ADMIN_KEY_ENV} is not set")
    return [arg.replace(ADMIN_KEY_REFERENCE, key) for arg in command]


def adopts_orphans() -> bool:
    """Whether the kernel hands orphaned descendants to this process: it is the init of its PID namespace (a
    container's PID 1) or a subreaper."""
    if os.getpid() == 1:
        return True
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


def children(pid: int | None = None) -> set[int]:
    """The children of process `pid` (this one by default), from each of its threads' lists."""
    folder = Path(f"/proc/{pid or os.getpid()}/task")
    found = set()
    try:
        threads = list(folder.iterdir())
    except OSError:
        return found
    for thread in threads:
        try:
            found.update(int(child) for child in (thread / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def waited_for() -> set[int]:
    """The pids a Popen of this process has not collected yet (subprocess's, and multiprocessing's and asyncio's,
    which are alike): their owners wait for them by pid, and would lose the exit status to anyone else's wait."""
    pids = set()
    for thing in gc.get_objects():
        if type(thing).__name__ == "Popen" and getattr(thing, "returncode", 0) is None:
            pid = getattr(thing, "pid", None)
            if isinstance(pid, int):
                pids.add(pid)
    return pids


class OrphanReaper(threading.Thread):
    """What init does, for a process that is one (`s2t serve` or the keeper as a container's PID 1) or a subreaper:
    the processes the kernel hands it (the stubs of a server that died, and their own children) are waited for
    once they exit, so that no zombie of theirs piles up. Its own children it leaves to whoever started them: a
    zombie is reaped only when it was one on two looks in a row and no Popen of this process has its pid."""

    def __init__(self, interval_s: float = ORPHAN_REAP_INTERVAL_S):
        super().__init__(name="s2t-orphan-reaper", daemon=True)
        self.interval_s = interval_s
        self.reaped: list[int] = []
        self._zombies_last_look: set[int] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.reap()

    def reap(self) -> list[int]:
        zombies = {pid for pid in children() if _state(pid) == "Z"}
        # The second look: a Popen sets its pid moments after the fork, before its child can have exited twice.
        due, self._zombies_last_look = zombies & self._zombies_last_look, zombies
        if not due:
            return []
        reaped = []
        for pid in sorted(due - waited_for()):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except ChildProcessError:
                continue
        self.reaped += reaped
        return reaped

    def stop(self) -> None:
        self._stop_event.set()


def _state(pid: int) -> str | None:
    stat = leftovers.read_stat(Path(f"/proc/{pid}"))
    return stat.state if stat is not None else None


def reap_orphans() -> OrphanReaper | None:
    """An OrphanReaper started where the kernel hands this process orphans; None elsewhere (none ever come)."""
    if not adopts_orphans():
        return None
    reaper = OrphanReaper()
    reaper.start()
    return reaper


def reap_group(pid: int) -> None:
    """Kill what is left of the server's process group: a stub whose server died is an orphan in it."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class RestartPolicy:
    """At most `max_restarts` in `window_seconds`: the first at once (a crash costs only the new server's start),
    the next ones after a doubling delay."""

    max_restarts: int = 5
    window_seconds: float = 600.0
    first_delay_seconds: float = 1.0
    max_delay_seconds: float = 30.0
    _restarts: list[float] = field(default_factory=list)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next start, or None: too many restarts, give up."""
        self._restarts = [t for t in self._restarts if now - t < self.window_seconds]
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = doubling_delay(len(self._restarts) - 1, self.first_delay_seconds, self.max_delay_seconds) \
            if self._restarts else 0.0
        self._restarts.append(now)
        return delay


class MetricsServer(threading.Thread):
    """The supervisor's counters in Prometheus text format on /metrics."""

    def __init__(self, port: int, state: SupervisorState, host: str = "0.0.0.0"):
        super().__init__(name="s2t-supervisor-metrics", daemon=True)
        state_ref = state

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's naming
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = state_ref.prometheus().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, port), Handler)

    def run(self) -> None:
        self.httpd.serve_forever(poll_interval=0.5)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_metrics(port: int | None, state: SupervisorState, log) -> MetricsServer | None:
    if not port:
        return None
    try:
        server = MetricsServer(port, state)
    except OSError as err:
        log(f"s2t supervisor: no metrics on port {port}: {err}")
        return None
    server.start()
    return server


def option(command: list[str], name: str, default: str | None = None) -> str | None:
    """The value of the last `--name=value` in a tritonserver command."""
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    return values[-1] if values else default


def restricted_headers(command: list[str]) -> dict[str, str]:
    """The header a repository-API call needs, from `--http-restricted-api=...model-repository...:HEADER=KEY`."""
    for value in (arg.split("=", 1)[1] for arg in command if arg.startswith("--http-restricted-api=")):
        categories, header, key = restricted_apis.parse(value)
        if "model-repository" in categories and header:
            return {header: key}
    return {}


def loopback_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to now (tritonserver binds it moments later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fronted(command: list[str], env: dict[str, str], fronts: Path) -> tuple[list[str], dict[str, str]]:
    """The tritonserver command and environment that put the fronts built into `fronts` on the command's public
    HTTP and gRPC ports (8000 and 8001 unless it says otherwise) and Triton's own endpoints on loopback ports behind
    them. A protocol the command switches off (`--allow-http=false`) gets no front; TLS the command asks of Triton's
    gRPC endpoint (`--grpc-use-ssl`, mutual too) is the gRPC front's."""
    from s2t.serve import grpc_front, http_front, server_hook
    from s2t.serve.request_limits import grpc_max_message_bytes

    fronts = fronts.resolve()
    repositories = [Path(arg.split("=", 1)[1]) for arg in command if arg.startswith("--model-repository=")]
    drain_seconds = int(option(command, "exit-timeout-secs", "30")) + 5
    http_on, grpc_on = option(command, "allow-http", "true") != "false", option(command, "allow-grpc", "true") != "false"
    public_http, public_grpc = int(option(command, "http-port", "8000")), int(option(command, "grpc-port", "8001"))
    own_http = loopback_port() if http_on else public_http
    own_grpc = loopback_port() if grpc_on else public_grpc
    kept = [arg for arg in command if not arg.startswith(ENDPOINT_OPTIONS)]
    command = [*kept, "--http-address=127.0.0.1", f"--http-port={own_http}",
               "--grpc-address=127.0.0.1", f"--grpc-port={own_grpc}"]
    try:
        tls = None
        if grpc_on:  # TLS is the front's: the relay to Triton's own endpoint on loopback is plaintext
            command, tls = grpc_front.tls_of_triton(command)
        if grpc_on:  # the gRPC front's environment preloads the hook
            env = grpc_front.in_process_env(env, public_grpc, own_grpc, grpc_max_message_bytes(repositories),
                                            grpc_front.DEFAULT_MAX_CALLS, drain_seconds, command,
                                            library=fronts / grpc_front.LIBRARY.name,
                                            hook=fronts / server_hook.HOOK.name, tls=tls)
        else:
            env = server_hook.preloaded(env, fronts / server_hook.HOOK.name)
        if http_on:
            options = http_front.front_options(public_http, own_http, http_front.max_body_bytes(repositories),
                                               drain_seconds)
            env = http_front.in_process_env(env, options, command, library=fronts / http_front.LIBRARY.name)
    except (grpc_front.GrpcFrontError, http_front.HttpFrontError, server_hook.ServerHookError) as err:
        raise SystemExit(f"s2t keeper: {err}") from None
    return command, env


def serves_openai_model(repositories: list[str]) -> bool:
    """Whether one of the repositories holds the model the OpenAI-compatible API fronts."""
    return any((Path(repository) / OPENAI_MODEL / "config.pbtxt").is_file() for repository in repositories)


def start_openai(http_url: str, port: int, log):
    """The OpenAI-compatible API in a thread of this process, in front of the server at `http_url`; None (said in
    the log) when it cannot start: aiohttp missing from the image, or the port taken."""
    try:
        from s2t.serve.openai_server import OpenAIFrontend
    except ImportError as err:
        log(f"s2t keeper: the OpenAI API cannot start: {err} (the image's `llm` target installs aiohttp)")
        return None
    try:
        frontend = OpenAIFrontend(http_url, port).start()
    except RuntimeError as err:
        log(f"s2t keeper: {err}")
        return None
    log(f"s2t keeper: OpenAI API on port {port} (/v1/models, /v1/chat/completions, /v1/completions)")
    return frontend


def keep(server, stop: threading.Event, replace: threading.Event, policy: RestartPolicy, state: SupervisorState,
         log=lambda message: print(message, file=sys.stderr, flush=True)) -> int:
    """`s2t serve`'s loop around a started TritonServer: start it again when it dies (a hung one is aborted by its
    supervisor), or when `replace` is set (a dead stub its supervisor cannot reload in it), after the policy's
    delay, until `stop` is set or the policy gives up. A gRPC front inside tritonserver ends and starts with it; one
    in a process of its own (--grpc-front-process) stays up across its starts (calls meanwhile refused UNAVAILABLE),
    and is started again should it die. The exit code."""
    while not stop.wait(0.1):
        try:
            front_code = server.restart_dead_grpc_front()
        except Exception as err:  # noqa: BLE001 - without its front the server has no gRPC port
            log(f"s2t serve: the gRPC front died and could not start again: {err}")
            return 1
        if front_code is not None:
            log(f"s2t serve: the gRPC front exited with code {front_code}; started again")
        returncode = server.process.poll()
        if returncode is None and not replace.is_set():
            continue
        why = "replaced (a dead stub cannot be reloaded in it)" if returncode is None else \
            f"exited with code {returncode}"
        if returncode is not None:
            server.reap()  # at once: its orphaned stubs must not wait for the supervisor to stop
        server.stop(keep_grpc_front=True)
        delay = policy.next_delay(time.monotonic())
        if delay is None:
            log(f"s2t serve: tritonserver {why}; {policy.max_restarts} restarts within "
                f"{policy.window_seconds:.0f} s, giving up")
            return exit_code(returncode) if returncode else 1
        log(f"s2t serve: tritonserver {why}; starting it again in {delay:.0f} s")
        if stop.wait(delay):
            return 0
        replace.clear()
        try:
            server.start()
        except Exception as err:  # noqa: BLE001 - a failed start is one more death, under the same policy
            log(f"s2t serve: tritonserver did not start again: {err}")
            continue
        state.record("server_restart", detail=why)
        log(f"s2t serve: tritonserver running again (pid {server.process.pid})")
    return 0


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(command: list[str], supervisor_port: int | None, state_dir: Path | None, startup_seconds: float,
        log=lambda message: print(message, file=sys.stderr, flush=True),
        openai_port: int = DEFAULT_OPENAI_PORT, hang_seconds: float = HangSettings.seconds,
        fronts: Path | None = None) -> int:
    from s2t.serve.supervisor import StubSupervisor

    repositories = [arg.split("=", 1)[1] for arg in command if arg.startswith("--model-repository=")]
    state_path = (state_dir or (VersionStore(Path(repositories[0])).control if repositories else None))
    state = SupervisorState(path=state_path / STATE_FILE if state_path else None)
    metrics = start_metrics(supervisor_port, state, log)
    # Usually the container's PID 1: the stubs of a server that died come to it, and nobody else would reap them.
    reaper = reap_orphans()
    # A container restarted in place (same /dev/shm) starts without the previous server's stubs and regions.
    leftovers.clean(repositories)
    http_url = f"localhost:{option(command, 'http-port', '8000')}"
    env = dict(os.environ)
    if fronts is not None:
        command, env = fronted(command, env, fronts)
    process = spawn(command, env)
    stopping = threading.Event()

    def forward(signum, _frame):
        stopping.set()
        if process.poll() is None:
            process.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    supervisor = None
    gave_up = threading.Event()

    def replace(why: str) -> None:
        log(f"s2t keeper: {why}; stopping the server so that a new one starts")
        gave_up.set()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)

    if wait_until_ready(TritonAdmin(http_url), lambda: process.poll() is None, startup_seconds, poll_s=0.5) \
            and not stopping.is_set():
        supervisor = StubSupervisor(process.pid, http_url, option(command, "model-control-mode") == "explicit",
                                    restricted_headers(command),
                                    metrics_url=f"localhost:{option(command, 'metrics-port', '8002')}",
                                    state=state, on_replace=replace,
                                    control_lock=VersionStore(Path(repositories[0])).lock if repositories else None,
                                    repositories=[Path(r) for r in repositories],
                                    hang_settings=HangSettings(hang_seconds))
        supervisor.start()
    openai = None
    if openai_port and serves_openai_model(repositories) and process.poll() is None and not stopping.is_set():
        openai = start_openai(http_url, openai_port, log)
        if openai is None:
            # A deployment that serves the language model promises its API: fail loudly, so that the orchestrator
            # shows the container failing instead of a server without the port its clients call.
            gave_up.set()
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    returncode = process.wait()
    # After the server: streams in flight while it drains still reach their clients.
    if openai is not None:
        openai.stop()
    reap_group(process.pid)
    leftovers.wait_group_gone(process.pid)
    leftovers.clean(repositories)
    if supervisor is not None:
        supervisor.stop()
    if metrics is not None:
        metrics.stop()
    if reaper is not None:
        reaper.stop()
    if stopping.is_set() and not gave_up.is_set():
        return exit_code(returncode)
    log(f"s2t keeper: tritonserver exited with code {returncode}")
    return exit_code(returncode) or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m s2t.serve.keeper", description=__doc__.split("\n\n")[0])
    parser.add_argument("--supervisor-port", type=int, default=8003,
                        help="port of the supervisor's Prometheus metrics (0: none)")
    parser.add_argument("--state-dir", type=Path,
                        help="where supervisor.json goes (default: the first repository's control area)")
    parser.add_argument("--startup-seconds", type=float, default=600.0,
                        help="how long tritonserver may take to become ready before supervision starts anyway")
    parser.add_argument("--hang-seconds", type=float, default=HangSettings.seconds,
                        help="an execute running this long means a hung server: it is aborted and the keeper exits")
    parser.add_argument("--openai-port", type=int, default=DEFAULT_OPENAI_PORT,
                        help=f"where a repository holds `{OPENAI_MODEL}`: the OpenAI-compatible API's port (0: none)")
    parser.add_argument("--fronts", type=Path,
                        help="the folder holding the HTTP and gRPC fronts and their hook (native/'s build): they take "
                             "the command's public ports, Triton's own endpoints move to loopback behind them")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- tritonserver ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the tritonserver command after --")
    # Shared memory, logging and trace restricted whatever the command says (s2t/serve/restricted_apis.py).
    command = restrict(with_admin_key(command, dict(os.environ)))
    return run(command, args.supervisor_port, args.state_dir, args.startup_seconds, openai_port=args.openai_port,
               hang_seconds=args.hang_seconds, fronts=args.fronts)


if __name__ == "__main__":
    sys.exit(main())
