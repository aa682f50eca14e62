"""CPU seconds and resident memory of a server's whole process tree (tritonserver and its stubs, uvicorn and
its workers), read from /proc through psutil."""
from __future__ import annotations

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


class CpuMeter:
    """CPU seconds the tree spends between `start()` and `stop()`."""

    def __init__(self, pid: int):
        self.pid = pid
        self._start = self._wall = 0.0
        self.seconds = self.wall_seconds = float("nan")

    def __enter__(self) -> "CpuMeter":
        self._start, self._wall = cpu_seconds(self.pid), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = cpu_seconds(self.pid) - self._start
        self.wall_seconds = time.monotonic() - self._wall
