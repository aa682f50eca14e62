"""What the hostile soak watches of the services it soaks: the RSS of the serving tree and of the gateway, per phase
and as time series (the serving tree's processes one by one too, for the fit projected to 72 hours), every process of both trees and every stub's shared-memory region (to find what outlives the shutdown), the pids
that tell a restart, and the supervisor's counters."""
from __future__ import annotations

import http.client
import os
import threading
import time
from dataclasses import dataclass

import psutil

from s2t.soak.hostile.valid_paths import Clock, host_port
from s2t.serve.leftovers import regions_of
from s2t.soak.resident import owned_bytes, tree_owned_bytes
from s2t.serve.stub_command import SHM_DIR
from s2t.serve.supervisor import stubs_of

# After shutdown, processes and regions get this long to go before they count as left over.
SHUTDOWN_GRACE_S = 10.0


@dataclass(frozen=True)
class Seen:
    pid: int
    created: float
    name: str


def _alive(seen: Seen) -> bool:
    """Still running: the same process (not a new one with its pid), and not a zombie waiting to be reaped."""
    try:
        proc = psutil.Process(seen.pid)
        return proc.create_time() == seen.created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Watch(threading.Thread):
    """Samples, every `every_s`, the RSS of the serving tree (s2t serve, tritonserver, stubs) and of the gateway,
    and remembers every process of both trees and every stub's shared-memory region."""

    def __init__(self, serve_pid: int | None, gateway_pid: int | None, clock: Clock, every_s: float):
        super().__init__(name="soak-watch", daemon=True)
        self.serve_pid, self.gateway_pid, self.clock, self.every_s = serve_pid, gateway_pid, clock, every_s
        self.rss: dict[str, dict[str, dict[str, int]]] = {"serving": {}, "gateway": {}}
        # (seconds into the run, bytes) per group and per process of the serving tree.
        self.series: dict[str, list[tuple[float, int]]] = {"serving": [], "gateway": []}
        self.process_series: dict[str, list[tuple[float, int]]] = {}
        self.seen: dict[int, Seen] = {}
        self.regions: set[str] = set()
        self.stop = threading.Event()

    def look(self) -> None:
        for root in (self.serve_pid, self.gateway_pid):
            if root is None:
                continue
            try:
                tree = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                try:
                    self.seen.setdefault(proc.pid, Seen(proc.pid, proc.create_time(), _name(proc)))
                except psutil.NoSuchProcess:
                    continue
        server = tritonserver_pid(self.serve_pid)
        if server is not None:
            self.regions |= regions_of(stubs_of(server))

    def sample(self) -> None:
        phase, at = self.clock.phase(), round(self.clock.elapsed(), 2)
        for group, pid in (("serving", self.serve_pid), ("gateway", self.gateway_pid)):
            if pid is None:
                continue
            try:
                size = tree_owned_bytes(pid)
            except psutil.NoSuchProcess:
                continue
            row = self.rss[group].setdefault(phase, {"max": 0, "last": 0, "samples": 0})
            row.update(max=max(row["max"], size), last=size, samples=row["samples"] + 1)
            self.series[group].append((at, size))
        for name, size in _tree_rss(self.serve_pid).items():
            self.process_series.setdefault(name, []).append((at, size))

    def run(self) -> None:
        while not self.stop.is_set():
            self.look()
            self.sample()
            self.stop.wait(self.every_s)


def _tree_rss(root: int | None) -> dict[str, int]:
    """Resident memory (resident.owned_bytes) of each process of the tree under `root`, by name (a stub by its model
    instance)."""
    if root is None:
        return {}
    try:
        tree = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    sizes: dict[str, int] = {}
    for proc in tree:
        try:
            name = "tritonserver" if proc.name() == "tritonserver" else _name(proc)
            sizes[name] = sizes.get(name, 0) + owned_bytes(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return sizes


def _name(proc: psutil.Process) -> str:
    cmd = proc.cmdline()
    stub = next((a for a in cmd if a.endswith("_0") or "_0_" in a), None)
    return stub or " ".join(cmd[:3])[:80] or proc.name()


def tritonserver_pid(serving_pid: int | None) -> int | None:
    """tritonserver: the process itself, or the child of `s2t serve` by that name."""
    if serving_pid is None:
        return None
    try:
        root = psutil.Process(serving_pid)
        if root.name() == "tritonserver":
            return serving_pid
        return next((p.pid for p in root.children() if p.name() == "tritonserver"), None)
    except psutil.NoSuchProcess:
        return None


def serving_pids(serve_pid: int | None, grpc_port: int | None = None) -> dict[str, int]:
    """tritonserver's pid and each stub's, by model instance and version, and the pid of whatever else serves the
    public gRPC port (a front before Triton's own), by its name."""
    server = tritonserver_pid(serve_pid)
    if server is None:
        return {}
    pids = {"tritonserver": server, **{f"{s.instance}@{s.version}": pid for pid, s in stubs_of(server).items()}}
    owner = port_owner(grpc_port) if grpc_port is not None else None
    if owner is not None and owner[0] != server:
        pids[f"gRPC port: {owner[1]}"] = owner[0]
    return pids


def listening_pids() -> dict[int, int]:
    """Port -> pid of every TCP listener this user can see."""
    listening = {}
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.pid:
                listening[conn.laddr.port] = conn.pid
    except psutil.AccessDenied:
        pass  # another user's processes: what depends on them is then reported not measured
    return listening


def port_owner(port: int) -> tuple[int, str] | None:
    """(pid, process name) of the listener on `port`, None when not found."""
    pid = listening_pids().get(port)
    if pid is None:
        return None
    try:
        return pid, psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return None


def shm_entries() -> list[str]:
    try:
        return sorted(p.name for p in SHM_DIR.iterdir())
    except OSError:
        return []


def run_processes() -> list[str]:
    """This process's descendants, as `pid name`."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            out.append(f"{proc.pid} {_name(proc)}")
        except psutil.NoSuchProcess:
            continue
    return out


def metrics_page(metrics_url: str) -> str:
    connection = http.client.HTTPConnection(*host_port(metrics_url), timeout=30)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return ""
    finally:
        connection.close()


def supervisor_counts(supervisor_url: str) -> list[str]:
    """What `s2t serve`'s supervisor did during the run (reloads by model and reason, models given up, server
    restarts), as its metric samples: a changed stub pid is explained here or nowhere."""
    return [line for line in metrics_page(supervisor_url).splitlines() if line and not line.startswith("#")]


def leftovers(watch: Watch | None, grace_s: float = SHUTDOWN_GRACE_S) -> tuple[list[str], list[str]]:
    """Processes of the run still alive and regions of its stubs still in /dev/shm, after `grace_s` for exits."""
    if watch is None:
        return [], []
    deadline = time.monotonic() + grace_s
    while True:
        alive = [f"{s.pid} {s.name}" for s in watch.seen.values() if _alive(s) and s.pid != os.getpid()]
        regions = sorted(r for r in watch.regions if (SHM_DIR / r).exists())
        if (not alive and not regions) or time.monotonic() > deadline:
            return alive, regions
        time.sleep(0.5)
