"""CPU seconds and resident memory of a server's whole process tree (tritonserver and its stubs, uvicorn and
its workers), read from /proc through psutil."""
from __future__ import annotations

import resource
import threading
import time

import psutil


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and its living descendants (children reaped during a run are lost,
    which is why runs are measured on a server whose process set is stable)."""
    total = 0.0
    for proc in _tree(pid):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU of this one process, its children left out (tritonserver's own threads, without the stubs)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def rss_bytes(pid: int) -> int:
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def process_rss(pid: int) -> int:
    """RSS of this one process (psutil.NoSuchProcess once it is gone)."""
    return psutil.Process(pid).memory_info().rss


def rss_by_process(pid: int) -> dict[str, int]:
    """RSS per process, named by its command (a stub's name carries its model: `risk_scorer_0_0`)."""
    out = {}
    for proc in _tree(pid):
        try:
            cmd = proc.cmdline()
            name = next((a for a in cmd if a.endswith("_0") or "_0_" in a), None) or proc.name()
            out[f"{name} ({proc.pid})"] = proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return out


def per_request(delta: dict, requests: int) -> dict:
    """CPU microseconds per request from a round's CPU seconds (`tree`: the server's process tree, `own`: its root
    process alone, `grpc_front`: a gRPC front in a process of its own, `client`: the load generator): the whole
    server (tree and front), the root's own process (front ends, batcher, models run in process), the gRPC front,
    the children (the stubs) and the load generator. A round that answered nothing divides by one."""
    n = max(requests, 1)
    return {"server_cpu_us_per_request": round(1e6 * (delta["tree"] + delta["grpc_front"]) / n, 1),
            "front_end_cpu_us_per_request": round(1e6 * delta["own"] / n, 1),
            "grpc_front_cpu_us_per_request": round(1e6 * delta["grpc_front"] / n, 1),
            "stubs_cpu_us_per_request": round(1e6 * (delta["tree"] - delta["own"]) / n, 1),
            "client_cpu_us_per_request": round(1e6 * delta["client"] / n, 1)}


class CpuSplit:
    """The CPU a measured stretch cost, split: the server's tree rooted at `pid`, that root's own process, a gRPC
    front of its own process (`front_pid`) and this process's children that ended meanwhile (the load generators,
    from getrusage). The one CPU accounting of every bench round."""

    def __init__(self, pid: int, front_pid: int | None = None):
        self.pid, self.front_pid = pid, front_pid
        self.delta = {"tree": float("nan"), "own": float("nan"), "grpc_front": float("nan"), "client": float("nan")}
        self.wall_seconds = float("nan")

    def _read(self) -> dict:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {"tree": cpu_seconds(self.pid), "own": own_cpu_seconds(self.pid),
                "grpc_front": own_cpu_seconds(self.front_pid) if self.front_pid else 0.0,
                "client": children.ru_utime + children.ru_stime, "wall": time.monotonic()}

    def __enter__(self) -> "CpuSplit":
        self._before = self._read()
        return self

    def __exit__(self, *exc) -> None:
        after = self._read()
        self.delta = {key: after[key] - self._before[key] for key in ("tree", "own", "grpc_front", "client")}
        self.wall_seconds = after["wall"] - self._before["wall"]

    @property
    def server_seconds(self) -> float:
        return self.delta["tree"] + self.delta["grpc_front"]

    def per_request(self, requests: int) -> dict:
        return per_request(self.delta, requests)


class PeakRss:
    """Largest summed RSS of the process trees rooted at `pids`, sampled every 0.2 s between `start()` and
    `stop()` (or over a `with` block)."""

    def __init__(self, pids: list[int]):
        self.pids, self.peak = list(pids), 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, sum(self._rss(pid) for pid in self.pids))
            if self._done.wait(0.2):
                return

    @staticmethod
    def _rss(pid: int) -> int:
        """A root gone mid-round weighs nothing from then on; the others are still sampled."""
        try:
            return rss_bytes(pid)
        except psutil.NoSuchProcess:
            return 0

    def start(self) -> "PeakRss":
        self._thread.start()
        return self

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak

    def __enter__(self) -> "PeakRss":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
