"""The server's life on the real tritonserver: a dead server is started again and leaves no stub behind, a
killed `s2t serve` takes its server along, the supervisor retries with backoff and a cap and says what it did."""
from __future__ import annotations

import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import DATA_CSV, ENSEMBLES, MODEL_REPOSITORY, ROOT, S2T, free_port
from s2t.serve.healing import HealSettings, SupervisorState
from s2t.serve.leftovers import SHM_DIR as SHM, regions_of
from s2t.serve.supervisor import Reloader, StubSupervisor, stubs_of
from s2t.serve.triton_server import TritonServer
from tests.integration.servers import triton_server



def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://localhost:{http_port}/v2/health/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def copy_repository(tmp_path: Path) -> Path:
    repo = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def stream_load(grpc_url: str, stop: threading.Event) -> threading.Thread:
    """risk_stream streams in flight (its stub is the one that outlived a killed server)."""
    from s2t.clients import stream_client
    from s2t.models import dataset
    rows = [{"features": f} for f in dataset.load(DATA_CSV).records()]

    def run():
        while not stop.is_set():
            try:
                stream_client.replay(grpc_url, rows[:400], 8, shuffle=0.2, window=8, timeout_s=10)
            except Exception:  # noqa: BLE001 - the server is killed under it on purpose
                time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def serve(built_artifacts, tmp_path):
    """`s2t serve` on a copy of the repository and free ports; yields (process, ports, repository, log)."""
    repo = copy_repository(tmp_path)
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(),
             "SUPERVISOR_PORT": free_port()}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    log_path = tmp_path / "serve.log"
    log = open(log_path, "wb")
    process = subprocess.Popen([str(S2T), "serve", "--exit-timeout", "5", "--repository", str(repo),
                                "--repository", str(ENSEMBLES)], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    if not wait_until(lambda: ready(ports["HTTP_PORT"]) or process.poll() is not None, 120, 0.3) \
            or process.poll() is not None:
        process.kill()
        pytest.fail(log_path.read_text()[-3000:])
    yield process, ports, repo, log_path
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    log.close()


def server_pid(serve_pid: int) -> int | None:
    """The tritonserver `s2t serve` runs now (None between two); its other child is the gRPC front."""
    return next((pid for task in Path(f"/proc/{serve_pid}/task").glob("*")
                 for pid in map(int, children_of(task).split()) if comm(pid) == "tritonserver"), None)


def children_of(task: Path) -> str:
    """The task's children listing; empty for a thread that ended since the tasks were listed."""
    try:
        return (task / "children").read_text()
    except OSError:
        return ""


def comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def supervisor_metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


# The stream clients' own threads fail when the server is killed under them: that is the point.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_serve_starts_a_killed_tritonserver_again_and_no_stub_of_the_dead_one_lives_on(serve):
    process, ports, repo, log = serve
    old_server = server_pid(process.pid)
    old_stubs = stubs_of(old_server)
    assert "risk_stream" in {s.model for s in old_stubs.values()}
    old_regions = regions_of(old_stubs)
    assert old_regions and all((SHM / name).exists() for name in old_regions)
    stop = threading.Event()
    stream_load(f"localhost:{ports['GRPC_PORT']}", stop)
    time.sleep(2.5)
    os.kill(old_server, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        assert wait_until(lambda: not any(alive(pid) for pid in old_stubs), 5), \
            {s.model for pid, s in old_stubs.items() if alive(pid)}
        reaped_after = time.monotonic() - killed_at
        # The dead server unlinked none of its shared-memory regions: s2t serve removes them (owners gone).
        assert wait_until(lambda: not any((SHM / name).exists() for name in old_regions), 15), \
            [name for name in old_regions if (SHM / name).exists()]
        assert wait_until(lambda: ready(ports["HTTP_PORT"]), 60), log.read_text()[-3000:]
        serving_after = time.monotonic() - killed_at
    finally:
        stop.set()
    assert process.poll() is None, "s2t serve keeps running"
    new_server = server_pid(process.pid)
    assert new_server != old_server
    assert wait_until(lambda: "s2t_server_restarts_total 1" in supervisor_metrics(ports["SUPERVISOR_PORT"]), 5)
    state = json.loads((repo.parent / ".model_repository.s2t" / "supervisor.json").read_text())
    assert state["server_restarts"] == 1 and state["server_pid"] == new_server
    assert "exited with code -9" in log.read_text()
    print(f"\nserver killed: stubs reaped after {reaped_after:.1f} s, serving again after {serving_after:.1f} s")


def test_a_killed_serve_takes_its_tritonserver_and_every_stub_along(serve):
    process, _, _, _ = serve
    server = server_pid(process.pid)
    stubs = list(stubs_of(server))
    regions = regions_of(stubs)
    assert stubs and regions
    process.kill()
    process.wait()
    # The server gets SIGTERM when its parent dies, drains (exit timeout 5 s) and stops its stubs.
    assert wait_until(lambda: not alive(server) and not any(alive(pid) for pid in stubs), 30)
    assert wait_until(lambda: not any((SHM / name).exists() for name in regions), 10)


@pytest.fixture
def held_region():
    """A region in /dev/shm named as the python backend names them, mapped by this test process: it has a live
    owner, so it must survive every clean-up."""
    path = SHM / f"triton_python_backend_shm_region_s2t-test-held-{os.getpid()}"
    path.write_bytes(b"\0" * 4096)
    with open(path, "r+b") as file:
        mapping = mmap.mmap(file.fileno(), 4096)
    try:
        yield path
    finally:
        mapping.close()
        path.unlink(missing_ok=True)


def test_after_a_crash_of_serve_and_its_server_the_next_serve_starts_with_no_orphan_left(serve, held_region,
                                                                                          tmp_path):
    process, _, repo, _ = serve
    server = server_pid(process.pid)
    stubs = stubs_of(server)
    regions = regions_of(stubs)
    assert regions
    # The whole unit dies at once (the host's OOM killer, a kill -9 of both): nobody unlinks anything.
    process.kill()
    os.kill(server, signal.SIGKILL)
    process.wait()
    assert wait_until(lambda: not alive(server), 10)
    assert any((SHM / name).exists() for name in regions), "the crash left no region: nothing to test"
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(), "SUPERVISOR_PORT": 0}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    with open(tmp_path / "next.log", "wb") as log:
        following = subprocess.Popen([str(S2T), "serve", "--exit-timeout", "5", "--repository", str(repo),
                                      "--repository", str(ENSEMBLES)], cwd=ROOT, env=env, stdout=log,
                                     stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: ready(ports["HTTP_PORT"]) or following.poll() is not None, 120, 0.3)
            assert following.poll() is None, (tmp_path / "next.log").read_text()[-3000:]
            assert not [name for name in regions if (SHM / name).exists()]
            assert not [stub.model for pid, stub in stubs.items() if alive(pid)]
            assert held_region.exists(), "a region some live process maps was removed"
            assert regions_of(stubs_of(server_pid(following.pid))), "the new server's own regions are there"
        finally:
            following.send_signal(signal.SIGTERM)
            assert following.wait(60) == 0


@pytest.fixture
def read_only_repository(built_artifacts, tmp_path):
    """A copy of the repository behind a read-only bind mount (as in the containers)."""
    source = copy_repository(tmp_path / "source")
    target = tmp_path / "ro" / "model_repository"
    target.mkdir(parents=True)
    for py in source.glob("*/[0-9]*/model.py"):
        subprocess.run([sys.executable, "-m", "py_compile", str(py)], check=True)
    done = subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"a read-only bind mount needs root: {done.stderr.strip()}")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def kill_stub(server: TritonServer, model: str) -> int:
    victim = next(s for s in stubs_of(server.process.pid).values() if s.model == model)
    os.kill(victim.pid, signal.SIGKILL)
    return victim.pid


def sockets_of(pid: int) -> int:
    """Sockets the process holds now; a descriptor it closes while they are counted is not held."""
    fds, held = Path(f"/proc/{pid}/fd"), 0
    for fd in os.listdir(fds):
        try:
            held += os.readlink(fds / fd).startswith("socket:")
        except FileNotFoundError:
            continue
    return held


def test_a_dead_server_leaves_its_clients_no_connection_to_wait_on_and_its_port_free(built_artifacts, tmp_path):
    """Triton forks a stub without closing its descriptors: one forked after the server began serving (any reload)
    held its listening sockets and client connections. When the server died (as Triton 2.51 aborts when a stub
    dies holding its shared-memory lock), that stub kept its clients waiting on connections nobody answered, and
    its port taken."""
    repo = copy_repository(tmp_path)
    server = triton_server([repo, ENSEMBLES], log_path=tmp_path / "triton.log")
    with server:
        client = socket.create_connection(("localhost", server.http_port), timeout=30)
        client.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert b" 200 " in client.recv(4096)
        def skill_adapter_stubs() -> set[int]:
            return {pid for pid, s in stubs_of(server.process.pid).items() if s.model == "skill_adapter"}
        first = skill_adapter_stubs()
        Reloader(server.http_url, explicit=False).reload("skill_adapter", [repo / "skill_adapter" / "1" / "model.py"])
        # The heir from the listing that found it: under load the next listing can miss a stub for a moment (its
        # forking thread gone, the stub passed to another thread of the server).
        listed: list[set[int]] = []
        assert wait_until(lambda: listed.append(skill_adapter_stubs() - first) or listed[-1], 30)
        heir = min(listed[-1])
        # A stub just forked may still be closing what it inherited: it must hold none once it has started.
        assert wait_until(lambda: sockets_of(heir) == 0, 10), "the reloaded stub holds none of the server's sockets"
        os.kill(server.process.pid, signal.SIGKILL)
        client.settimeout(15)
        try:
            assert client.recv(1) == b"", "the client's connection is closed"
        except ConnectionResetError:
            pass
        client.close()
        assert wait_until(lambda: not alive(heir), 5), "the dead server's stubs are gone"
        with socket.socket() as next_server:
            # As Triton binds: the closed connection's TIME_WAIT does not hold the port, a listener still open does.
            next_server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            next_server.bind(("0.0.0.0", server.http_port))


def test_poll_mode_on_a_read_only_repository_gives_the_model_up_at_once(read_only_repository, tmp_path):
    """No touch can reload it there: waiting would only prolong the failures, so the supervisor escalates."""
    server = triton_server([read_only_repository, ENSEMBLES],
                           log_path=tmp_path / "triton.log")
    given_up = []
    with server:
        state = SupervisorState(path=tmp_path / "supervisor.json")
        supervisor = StubSupervisor(server.process.pid, server.http_url, explicit=False, state=state,
                                    on_give_up=given_up.append)
        supervisor.start()
        try:
            kill_stub(server, "skill_adapter")
            assert wait_until(lambda: given_up, 10), state.to_dict()
        finally:
            supervisor.stop()
    saved = json.loads((tmp_path / "supervisor.json").read_text())
    assert given_up == ["skill_adapter"] and saved["given_up"] == ["skill_adapter"]
    assert [e["event"] for e in saved["events"]] == ["reload_failed", "gave_up"]
    assert "Read-only file system" in saved["events"][0]["detail"]


def test_a_reload_the_server_refuses_is_retried_with_growing_delays_then_given_up(built_artifacts, tmp_path):
    server = triton_server([copy_repository(tmp_path), ENSEMBLES],
                           model_control_mode="explicit", admin_key="the-key", log_path=tmp_path / "triton.log",
                           exit_timeout_seconds=5)
    given_up = []
    with server:
        state = SupervisorState(path=tmp_path / "supervisor.json")
        # A wrong key: Triton refuses every load, as it would while it cannot load the model.
        supervisor = StubSupervisor(server.process.pid, server.http_url, explicit=True,
                                    admin_headers={"admin-key": "not-the-key"}, state=state,
                                    heal_settings=HealSettings(first_delay_seconds=0.5, max_attempts=3),
                                    on_give_up=given_up.append)
        supervisor.start()
        try:
            kill_stub(server, "skill_adapter")
            assert wait_until(lambda: given_up, 20), state.to_dict()
        finally:
            supervisor.stop()
    saved = json.loads((tmp_path / "supervisor.json").read_text())
    failures = [e for e in saved["events"] if e["event"] == "reload_failed"]
    assert given_up == ["skill_adapter"] and saved["given_up"] == ["skill_adapter"]
    assert len(failures) == 3 and all("403" in e["detail"] or "Forbidden" in e["detail"] for e in failures), failures
    gaps = [b["at"] - a["at"] for a, b in zip(failures, failures[1:])]
    assert gaps[1] > gaps[0] >= 0.4, f"the delay between tries grows: {gaps}"


def test_serve_replaces_the_server_when_a_model_cannot_be_reloaded_in_it(read_only_repository, tmp_path):
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port(), "SUPERVISOR_PORT": "0"}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(S2T), "serve", "--exit-timeout", "5", "--repository",
                                    str(read_only_repository), "--repository", str(ENSEMBLES)], cwd=ROOT,
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: ready(ports["HTTP_PORT"]), 120, 0.3), log_path.read_text()[-3000:]
            first = server_pid(process.pid)
            state_file = read_only_repository.parent / ".model_repository.s2t" / "supervisor.json"
            assert wait_until(lambda: state_file.exists() and json.loads(state_file.read_text())["server_pid"] == first,
                              20), "supervision starts"
            victim = next(pid for pid, s in stubs_of(first).items() if s.model == "skill_adapter")
            os.kill(victim, signal.SIGKILL)
            assert wait_until(lambda: server_pid(process.pid) != first, 30), log_path.read_text()[-3000:]
            assert wait_until(lambda: ready(ports["HTTP_PORT"]), 60), log_path.read_text()[-3000:]
            assert "skill_adapter" in {s.model for s in stubs_of(server_pid(process.pid)).values()}
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    assert "replaced (a dead stub cannot be reloaded in it)" in log_path.read_text()


def test_explicit_mode_heals_a_killed_stub_on_a_read_only_repository(read_only_repository, tmp_path):
    import tritonclient.http as http
    key = "lifecycle-key"
    server = triton_server([read_only_repository, ENSEMBLES],
                           model_control_mode="explicit", admin_key=key, supervise=True,
                           supervisor_state=SupervisorState(path=tmp_path / "supervisor.json"),
                           log_path=tmp_path / "triton.log")
    with server:
        victim = kill_stub(server, "skill_adapter")
        assert wait_until(lambda: server.supervisor.heals, 10)
        assert wait_until(lambda: any(s.model == "skill_adapter" for s in stubs_of(server.process.pid).values()
                                      if s.pid != victim), 15)
        client = http.InferenceServerClient(server.http_url)
        try:
            assert wait_until(lambda: client.is_model_ready("risk_pipeline"), 15)
        finally:
            client.close()
    heal = server.supervisor_state.to_dict()
    assert heal["reloads"] == [{"model": "skill_adapter", "reason": "stub_died", "count": 1}]
    assert heal["reload_failures"] == {}


def proc_text(pid: int, name: str) -> bytes:
    return Path(f"/proc/{pid}/{name}").read_bytes()


def test_the_admin_key_is_on_no_command_line_and_in_no_stub_environment(built_artifacts, tmp_path, monkeypatch):
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    key = "k3y-" + os.urandom(8).hex()
    monkeypatch.setenv("S2T_ADMIN_KEY", key)
    server = triton_server([copy_repository(tmp_path), ENSEMBLES],
                           model_control_mode="explicit", admin_key=key, log_path=tmp_path / "triton.log",
                           exit_timeout_seconds=5)
    with server:
        stubs = stubs_of(server.process.pid)
        assert stubs
        assert key.encode() not in proc_text(server.process.pid, "cmdline")
        assert b"--s2t-hidden-argument" in proc_text(server.process.pid, "cmdline")
        for pid in stubs:
            assert key.encode() not in proc_text(pid, "environ"), stubs[pid].model
            assert key.encode() not in proc_text(pid, "cmdline"), stubs[pid].model
        # The key still guards the repository API: the server got it.
        client = http.InferenceServerClient(server.http_url)
        try:
            with pytest.raises(InferenceServerException, match="restricted|admin|authoriz|permission"):
                client.load_model("risk_decision")
            client.load_model("risk_decision", headers={"admin-key": key})
            assert client.is_model_ready("risk_decision")
        finally:
            client.close()


def test_the_keeper_fills_the_admin_key_reference_from_its_environment_and_shows_it_nowhere(built_artifacts,
                                                                                         tmp_path):
    from s2t.serve.triton_server import TRITON_DIR, assemble_backend_dir, server_env
    key = "k3y-" + os.urandom(8).hex()
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "s2t.serve.keeper", "--supervisor-port=0", f"--state-dir={tmp_path}", "--",
               str(TRITON_DIR / "bin" / "tritonserver"), f"--model-repository={copy_repository(tmp_path)}",
               f"--model-repository={ENSEMBLES}", f"--backend-directory={assemble_backend_dir(tmp_path / 'b')}",
               f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={free_port()}",
               "--model-control-mode=explicit", "--load-model=*",
               "--http-restricted-api=model-repository:admin-key=$(S2T_ADMIN_KEY)"]
    with open(tmp_path / "keeper.log", "wb") as log:
        keeper = subprocess.Popen(command, cwd=ROOT, env={**server_env(), "S2T_ADMIN_KEY": key}, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: ready(http_port), 120, 0.3), (tmp_path / "keeper.log").read_text()[-3000:]
            server = server_pid(keeper.pid)
            for pid in [keeper.pid, server, *stubs_of(server)]:
                assert key.encode() not in proc_text(pid, "cmdline")
            for pid in stubs_of(server):
                assert key.encode() not in proc_text(pid, "environ")
            request = urllib.request.Request(f"http://localhost:{http_port}/v2/repository/index", data=b"{}",
                                             headers={"admin-key": key}, method="POST")
            with urllib.request.urlopen(request, timeout=10) as resp:
                assert {m["name"] for m in json.load(resp)} >= {"skill_adapter", "risk_pipeline"}
            # The command restricted only the repository API, on HTTP: the keeper restricts logging, trace and
            # shared memory too, and the same on gRPC (no option there), all with the same key.
            assert_locked(f"localhost:{http_port}", f"localhost:{grpc_port}", key)
        finally:
            keeper.send_signal(signal.SIGTERM)
            assert keeper.wait(60) == 0


def assert_locked(http_url: str, grpc_url: str, key: str | None = None) -> None:
    """Logging, trace and shared memory refuse callers without the key on HTTP and gRPC; the key (when there is
    one to know) opens them."""
    import tritonclient.grpc as grpc
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    http_client, grpc_client = http.InferenceServerClient(http_url), grpc.InferenceServerClient(grpc_url)
    try:
        for client in (http_client, grpc_client):
            for call in (lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h),
                         lambda h: client.get_trace_settings(headers=h),
                         lambda h: client.register_system_shared_memory("x", "/s2t_none", 8, headers=h)):
                for headers in ({}, {"admin-key": "guess"}):
                    with pytest.raises(InferenceServerException, match="restricted"):
                        call(headers)
        if key:
            assert http_client.get_log_settings(headers={"admin-key": key})
            # Triton's gRPC endpoint reads the restricted-protocol header with this prefix.
            assert grpc_client.get_log_settings(headers={"triton-grpc-protocol-admin-key": key})
    finally:
        http_client.close()
        grpc_client.close()


WEDGE_MODEL = '''
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The first instance serves `healthy_requests` requests, then fails every one (raising fails the whole batch),
    as an instance whose state went bad would; the next instance stays healthy. `fail_every` N > 0: fails every
    Nth call."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        first = os.path.exists(parameters["first_instance_flag"]["string_value"])
        if first:
            os.remove(parameters["first_instance_flag"]["string_value"])
        self.healthy = int(parameters["healthy_requests"]["string_value"]) if first else float("inf")
        self.fail_every = int(parameters["fail_every"]["string_value"])
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        if self.calls > self.healthy or (self.fail_every and self.calls % self.fail_every == 0):
            raise RuntimeError("this instance is wedged")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
'''

WEDGE_CONFIG = '''
name: "wedge"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
parameters { key: "healthy_requests" value: { string_value: "%d" } }
parameters { key: "fail_every" value: { string_value: "%d" } }
parameters { key: "first_instance_flag" value: { string_value: "%s" } }
'''


def wedge_server(tmp_path: Path, healthy_requests: int, fail_every: int) -> TritonServer:
    repo = tmp_path / "wedge_repository"
    (repo / "wedge" / "1").mkdir(parents=True)
    (repo / "wedge" / "1" / "model.py").write_text(WEDGE_MODEL)
    flag = tmp_path / "first_instance"
    flag.touch()
    (repo / "wedge" / "config.pbtxt").write_text(WEDGE_CONFIG % (healthy_requests, fail_every, flag))
    return triton_server([repo], model_control_mode="explicit",
                        admin_key="wedge-key", supervise=True,
                        supervisor_state=SupervisorState(path=tmp_path / "supervisor.json"),
                        log_path=tmp_path / "triton.log")


def drive(server: TritonServer, seconds: float, rate: float = 50.0) -> list[tuple[float, bool]]:
    """(sent at, answered) for `seconds` of requests at `rate` per second from 4 threads."""
    import numpy as np
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException
    outcomes, end = [], time.monotonic() + seconds

    def run():
        client = http.InferenceServerClient(server.http_url, network_timeout=30)
        x = http.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        while time.monotonic() < end:
            sent = time.monotonic()
            try:
                client.infer("wedge", [x])
                outcomes.append((sent, True))
            except InferenceServerException:
                outcomes.append((sent, False))
            time.sleep(max(0.0, 4 / rate - (time.monotonic() - sent)))
        client.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)


def test_an_instance_failing_over_10_percent_of_requests_for_5_seconds_is_reloaded(built_artifacts, tmp_path):
    with wedge_server(tmp_path, healthy_requests=50, fail_every=0) as server:
        outcomes = drive(server, 16)
        heals = list(server.supervisor.heals)
        metrics = server.supervisor_state.prometheus()
    first_failure = next(t for t, ok in outcomes if not ok)
    assert [h.reason for h in heals] == ["error_rate"], heals
    detected = heals[0].detected_at - first_failure
    assert 5 <= detected <= 8, f"reloaded {detected:.1f} s after the failures began"
    after = [ok for t, ok in outcomes if t > heals[0].reloaded_at + 0.5]
    assert after and all(after[:20]), "the new instance serves"
    assert 's2t_supervisor_reloads_total{model="wedge",reason="error_rate"} 1' in metrics
    failed = sum(not ok for _, ok in outcomes)
    print(f"\nwedged instance: failing from {first_failure - outcomes[0][0]:.1f} s, reloaded after "
          f"{detected:.1f} s of failures, {failed} of {len(outcomes)} requests failed")


def test_an_instance_failing_under_10_percent_is_left_alone(built_artifacts, tmp_path):
    with wedge_server(tmp_path, healthy_requests=10 ** 9, fail_every=25) as server:
        outcomes = drive(server, 9)
        heals = list(server.supervisor.heals)
    failed = sum(not ok for _, ok in outcomes)
    assert 0 < failed < 0.1 * len(outcomes) and heals == []


def test_a_stub_that_died_before_supervision_started_is_found_and_reloaded(built_artifacts, tmp_path):
    server = triton_server([copy_repository(tmp_path), ENSEMBLES],
                           model_control_mode="explicit", admin_key="early-key", log_path=tmp_path / "triton.log",
                           exit_timeout_seconds=5)
    with server:
        victim = kill_stub(server, "risk_decision")
        time.sleep(0.5)
        supervisor = StubSupervisor(server.process.pid, server.http_url, explicit=True,
                                    admin_headers={"admin-key": "early-key"},
                                    state=SupervisorState(path=tmp_path / "supervisor.json"))
        supervisor.start()
        try:
            assert [(h.model, h.reason) for h in supervisor.heals] == [("risk_decision", "stub_died")]
            assert wait_until(lambda: any(s.model == "risk_decision" and s.pid != victim
                                          for s in stubs_of(server.process.pid).values()), 15)
            time.sleep(1)
            assert [h.model for h in supervisor.heals] == ["risk_decision"], "healed once, nothing else touched"
        finally:
            supervisor.stop()


def _openai_call(port: int, path: str, body: dict | None = None) -> tuple[int, dict]:
    """(status, JSON body) of one call to the OpenAI-compatible API; an HTTP error's status and body too."""
    import urllib.error
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://localhost:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _llm_keeper_command(tmp_path: Path, http_port: int, grpc_port: int, openai_port: int) -> list[str]:
    """The keeper as the llm image runs it, on a copy of the language model alone (the cheapest repository that
    holds it) and free ports."""
    from tests.conftest import LLM_REPOSITORY
    from s2t.serve.triton_server import TRITON_DIR, assemble_backend_dir
    repo = tmp_path / "model_repository_llm"
    shutil.copytree(LLM_REPOSITORY / "llm", repo / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    return [sys.executable, "-m", "s2t.serve.keeper", "--supervisor-port=0", f"--state-dir={tmp_path}",
            f"--openai-port={openai_port}", "--",
            str(TRITON_DIR / "bin" / "tritonserver"), f"--model-repository={repo}",
            f"--backend-directory={assemble_backend_dir(tmp_path / 'b')}", f"--http-port={http_port}",
            f"--grpc-port={grpc_port}", f"--metrics-port={free_port()}"]


def test_the_keeper_serves_the_openai_api_where_a_repository_holds_the_language_model(built_artifacts, tmp_path):
    """What the llm image runs: the keeper starts the OpenAI-compatible API once Triton is ready, valid and bad
    requests are answered side by side, the restricted APIs stay locked, and SIGTERM takes the API down with the
    server."""
    from concurrent.futures import ThreadPoolExecutor
    from s2t.serve.triton_server import server_env
    http_port, grpc_port, openai_port = free_port(), free_port(), free_port()
    command = _llm_keeper_command(tmp_path, http_port, grpc_port, openai_port)
    log_path = tmp_path / "keeper.log"

    def listing() -> list[str] | None:
        try:
            status, body = _openai_call(openai_port, "/v1/models")
        except OSError:
            return None
        return [m["id"] for m in body["data"]] if status == 200 else None

    with open(log_path, "wb") as log:
        keeper = subprocess.Popen(command, cwd=ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: keeper.poll() is not None or listing() is not None, 300, 0.5)
            assert listing() == ["llm"] and ready(http_port), log_path.read_text()[-3000:]
            completion = {"model": "llm", "prompt": "Credit risk is", "max_tokens": 2}
            bad = {**completion, "max_tokens": -1}
            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda body: _openai_call(openai_port, "/v1/completions", body),
                                        [completion, bad, completion, bad]))
            for status, body in answers[0::2]:
                assert status == 200 and body["usage"]["completion_tokens"] == 2, body
            for status, body in answers[1::2]:
                assert status == 400 and body["error"]["param"] == "max_tokens", body
            # The API changes nothing of the server's: shared memory, logging and trace still locked.
            assert_locked(f"localhost:{http_port}", f"localhost:{grpc_port}")
            server = server_pid(keeper.pid)
        finally:
            keeper.send_signal(signal.SIGTERM)
            code = keeper.wait(60)
        assert code == 0, log_path.read_text()[-3000:]
        assert not alive(server)
        with pytest.raises(OSError):
            _openai_call(openai_port, "/v1/models")


def test_a_keeper_that_cannot_open_the_openai_port_stops_its_server_and_fails(built_artifacts, tmp_path):
    """A deployment that serves the language model promises its API: with the port taken, the container fails
    (so the orchestrator shows it) rather than serving without it, and leaves no server or stub behind."""
    import socket
    from s2t.serve.triton_server import server_env
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        openai_port = taken.getsockname()[1]
        command = _llm_keeper_command(tmp_path, free_port(), free_port(), openai_port)
        log_path = tmp_path / "keeper.log"
        with open(log_path, "wb") as log:
            keeper = subprocess.Popen(command, cwd=ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
            servers: list[int] = []
            try:
                # The server comes up first (the API starts once it is ready), then goes.
                assert wait_until(lambda: keeper.poll() is not None or server_pid(keeper.pid) is not None, 60, 0.05)
                servers = [pid for pid in [server_pid(keeper.pid)] if pid]
                code = keeper.wait(300)
            finally:
                if keeper.poll() is None:
                    keeper.send_signal(signal.SIGTERM)
                    keeper.wait(60)
    text = log_path.read_text()
    assert code != 0, text[-3000:]
    assert f"port {openai_port}" in text, text[-3000:]
    assert servers and not any(alive(pid) for pid in servers)
