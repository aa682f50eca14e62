"""`s2t serve` has a new tritonserver ready within seconds of the old one's death, whatever killed it (SIGKILL, an
abort) in the middle of traffic (valid HTTP requests, gRPC streams open and in flight), and whatever state the dead
server's stubs are left in: zombies under a parent that never reaps them (as under a container's init that reaps
nobody), stopped (SIGSTOP) when their server died, or adopted by `s2t serve` itself as a container's PID 1 (a
subreaper here), which reaps them without taking its own children's exit status.

The times are measured and held to bounds: from the server's death (an abort takes a while to end it) to a new
server started, HEAL_BOUND_S (the dead server's clean-up); from the signal to the new server scoring, the death,
that bound and the new server's own start, itself held to twice the first start's time (the machine's load changes
between the two)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from s2t.serve.keeper import children
from s2t.serve.leftovers import SHM_DIR, dead, read_stat, regions_of
from s2t.serve.supervisor import stubs_of
from tests.conftest import ENSEMBLES, ROOT, S2T, free_port
from tests.integration.serve.test_lifecycle import comm, copy_repository, ready, stream_load, wait_until
from tests.integration.serve.test_server_crash_and_hang import record, score
from tests.integration.traffic import PACE_S

# From the death to the new tritonserver started: the dead server's group reaped and its leftovers cleaned.
HEAL_BOUND_S = 5.0
# A new server is started at most this many times slower than the first was (other work on the machine).
START_SLACK = 2.0
MIN_START_BOUND_S = 10.0

# Runs `s2t serve` as a child of a subreaper, as under a container's init. `adopting`: exec'd in its place, so that
# `s2t serve` is the subreaper, as it is as PID 1; `not-reaping`: the subreaper waits for `s2t serve` alone, as an
# init that reaps nobody else.
LAUNCHER = textwrap.dedent("""
    import ctypes, os, subprocess, sys
    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        sys.exit("cannot become a subreaper")
    mode, command = sys.argv[1], sys.argv[2:]
    if mode == "adopting":
        os.execv(command[0], command)
    sys.exit(subprocess.Popen(command).wait())
""")


class Serve:
    """`s2t serve` under the launcher: its pid, ports, repository and log, and the first start's time."""

    def __init__(self, tmp_path: Path, mode: str):
        self.repo = copy_repository(tmp_path)
        self.ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
                      "SUPERVISOR_PORT": free_port()}
        env = {**os.environ, **{k: str(v) for k, v in self.ports.items()}}
        self.log_path = tmp_path / "serve.log"
        self._log = open(self.log_path, "wb")
        started = time.monotonic()
        self.launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, mode, str(S2T), "serve", "--exit-timeout", "5", "--repository",
             str(self.repo), "--repository", str(ENSEMBLES)], cwd=ROOT, env=env, stdout=self._log,
            stderr=subprocess.STDOUT)
        self.pid = self.launcher.pid if mode == "adopting" else self._child_of_launcher()
        if not wait_until(lambda: ready(self.http_port) or self.launcher.poll() is not None, 120, 0.1) \
                or self.launcher.poll() is not None:
            self.stop()
            pytest.fail(self.log_path.read_text()[-3000:])
        self.first_start_s = time.monotonic() - started

    def _child_of_launcher(self) -> int:
        assert wait_until(lambda: children(self.launcher.pid), 30, 0.01)
        return next(iter(children(self.launcher.pid)))

    @property
    def http_port(self) -> int:
        return self.ports["HTTP_PORT"]

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.ports['GRPC_PORT']}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.launcher.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.launcher.wait(60)
            except subprocess.TimeoutExpired:
                self.launcher.kill()
                self.launcher.wait()
        self._log.close()


@pytest.fixture
def serve_under(built_artifacts, tmp_path):
    started = []

    def start(mode: str) -> Serve:
        started.append(Serve(tmp_path, mode))
        return started[-1]

    yield start
    for serve in started:
        serve.stop()


def grpc_score(url: str, payload: bytes) -> float:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("payload", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
        return float(client.infer("risk_pipeline", [tensor], client_timeout=5).as_numpy("probability").ravel()[0])
    finally:
        client.close()


def http_load(url: str, payload: bytes, stop: threading.Event) -> list[bool]:
    """Valid requests one after another until `stop`: whether each was answered."""
    outcomes: list[bool] = []

    def run():
        while not stop.wait(PACE_S):
            try:
                score(url, payload, timeout=5)
                outcomes.append(True)
            except (InferenceServerException, OSError):
                outcomes.append(False)
                time.sleep(0.05)

    threading.Thread(target=run, daemon=True).start()
    return outcomes


def server_pid(serve_pid: int) -> int | None:
    """The live tritonserver `s2t serve` runs now (None between two)."""
    return next((pid for pid in children(serve_pid) if comm(pid) == "tritonserver" and state(pid) != "Z"), None)


def state(pid: int) -> str | None:
    stat = read_stat(Path(f"/proc/{pid}"))
    return stat.state if stat is not None else None


def parent(pid: int) -> int | None:
    stat = read_stat(Path(f"/proc/{pid}"))
    return stat.parent if stat is not None else None


def kill_under_traffic(serve: Serve, payload: bytes, sig: int, stop_stubs: bool) -> dict:
    """Kills tritonserver with `sig` in the middle of traffic; the seconds until a new server is started and until
    it scores on HTTP and gRPC, with what the dead one left."""
    old_server = server_pid(serve.pid)
    old_stubs = stubs_of(old_server)
    old_regions = regions_of(old_stubs)
    assert old_stubs and old_regions
    stop = threading.Event()
    stream_load(serve.grpc_url, stop)
    answered = http_load(f"localhost:{serve.http_port}", payload, stop)
    time.sleep(2.0)
    if stop_stubs:
        for pid in old_stubs:
            os.kill(pid, signal.SIGSTOP)
        assert wait_until(lambda: all(state(pid) == "T" for pid in old_stubs), 5)
    answered_before = answered.count(True)
    os.kill(old_server, sig)
    killed_at = time.monotonic()
    try:
        # An abort takes a while to end the process (Triton's handler writes its stack, Python's its own).
        assert wait_until(lambda: dead(Path(f"/proc/{old_server}")), 60, 0.01)
        died_at = time.monotonic()
        assert wait_until(lambda: server_pid(serve.pid) not in (None, old_server), HEAL_BOUND_S + 30, 0.02), \
            serve.log()[-3000:]
        started_s = time.monotonic() - died_at
        new_server = server_pid(serve.pid)

        def scores() -> bool:
            try:
                return 0 <= score(f"localhost:{serve.http_port}", payload) <= 1 and \
                    0 <= grpc_score(serve.grpc_url, payload) <= 1
            except (InferenceServerException, OSError):
                return False

        assert wait_until(scores, 120, 0.05), serve.log()[-3000:]
        serving_s = time.monotonic() - killed_at
        time.sleep(1.0)  # traffic on the new server
    finally:
        stop.set()
    assert answered_before > 0 and answered.count(True) > answered_before, "valid requests answered before and after"
    assert server_pid(serve.pid) == new_server, "the new server keeps serving"
    return {"old_server": old_server, "old_stubs": old_stubs, "old_regions": old_regions, "new_server": new_server,
            "dying_s": died_at - killed_at, "started_s": started_s, "serving_s": serving_s}


def assert_within_bounds(serve: Serve, outcome: dict, what: str) -> None:
    start_bound = max(START_SLACK * serve.first_start_s, MIN_START_BOUND_S)
    print(f"\n{what}: first start {serve.first_start_s:.2f} s; the signal ended the server in "
          f"{outcome['dying_s']:.2f} s; a new server started {outcome['started_s']:.2f} s after its death (bound "
          f"{HEAL_BOUND_S:.0f} s), scoring on HTTP and gRPC {outcome['serving_s']:.2f} s after the signal (bound "
          f"{outcome['dying_s']:.2f} + {HEAL_BOUND_S:.0f} + {start_bound:.1f} s)")
    assert outcome["started_s"] <= HEAL_BOUND_S
    assert outcome["serving_s"] <= outcome["dying_s"] + HEAL_BOUND_S + start_bound
    assert wait_until(lambda: not any((SHM_DIR / name).exists() for name in outcome["old_regions"]), 10), \
        "the dead server's regions are removed"
    assert serve.launcher.poll() is None, "s2t serve keeps running"


# The stream clients' own threads fail when the server dies under them: that is the point.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT], ids=["SIGKILL", "SIGABRT"])
@pytest.mark.parametrize("stop_stubs", [False, True], ids=["stubs-running", "stubs-stopped"])
def test_a_dead_server_is_replaced_within_seconds_while_its_stubs_lie_unreaped_under_an_init_that_reaps_nobody(
        serve_under, german_credit_data, sig, stop_stubs):
    serve = serve_under("not-reaping")
    outcome = kill_under_traffic(serve, record(german_credit_data), sig, stop_stubs)
    assert_within_bounds(serve, outcome, f"{signal.Signals(sig).name}, stubs "
                                         f"{'stopped' if stop_stubs else 'running'}, nobody reaping them")
    # What the finding was: the dead server's stubs are zombies nobody will ever reap, and a new server serves.
    stubs = outcome["old_stubs"]
    assert all(state(pid) == "Z" and parent(pid) == serve.launcher.pid for pid in stubs), \
        {pid: (state(pid), parent(pid)) for pid in stubs}
    assert f"exited with code {-sig}" in serve.log()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_serve_as_pid_1_reaps_the_stubs_it_adopts_and_keeps_its_own_servers_exit_status(serve_under,
                                                                                         german_credit_data):
    serve = serve_under("adopting")
    outcome = kill_under_traffic(serve, record(german_credit_data), signal.SIGKILL, stop_stubs=False)
    assert_within_bounds(serve, outcome, "SIGKILL, stubs adopted by s2t serve")
    stubs = outcome["old_stubs"]
    # Handed to `s2t serve` when their server died, and reaped by it: gone, not zombies.
    assert wait_until(lambda: not any(state(pid) for pid in stubs), 5), \
        {pid: (state(pid), parent(pid)) for pid in stubs}
    assert not [pid for pid in children(serve.pid) if state(pid) == "Z"]
    # The server's own exit status reached the Popen that waits for it (another's wait would have made it 0).
    assert "exited with code -9" in serve.log()
