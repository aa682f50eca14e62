"""Whether a bench run was taken on a quiet machine: the 1-minute load average at its start, and the CPU that
processes other than the run's own (servers, load generators, the bench itself) used during each measured round.

The other processes' CPU is read from each of them (user + system time, /proc/PID/stat). The machine's busy time
(/proc/stat) beyond the run's own is recorded beside it but is not the measure: it is sampled by the timer tick and
also holds kernel work that no process is charged for (interrupts and timers on a core that was otherwise idle),
which a load generator's many short sleeps at a fixed low request rate raised to 11-25% of the CPU on the quiet
2-core VM while every process outside the run used under 1%.

A process the run started is the run's own for the whole round, even once it has left the run's tree: a
server stopped by SIGKILL leaves its stubs to finish on their own (reparented, still busy when the round ends), and
counting them as other processes marked a quiet run busy. The tree is sampled during each round for that.

Measured beside a test suite, the FastAPI apps lost 2-3x more than Triton: a figure from a busy machine says
nothing about either side, so such a run is marked not publishable, with the reasons."""
from __future__ import annotations

import math
import os
import platform
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

import psutil

# Over either limit the run is not publishable.
LOAD_PER_CORE_LIMIT = 0.25
OTHER_CPU_SHARE_LIMIT = 0.10
# How often a round looks at the run's process tree (one pass over /proc, a few ms of CPU on the run's cores).
TREE_SAMPLE_S = 1.0


@dataclass(frozen=True)
class RoundLoad:
    """One measured round: the whole machine's busy CPU and the run's own, over the same wall time."""

    label: str
    wall_seconds: float
    machine_cpu_seconds: float
    own_cpu_seconds: float
    cores: int
    # The other processes' own CPU over the round; None (a record without it): the machine's beyond the run's own.
    other_process_cpu_seconds: float | None = None

    @property
    def other_cpu_share(self) -> float:
        """The share of all cores that other processes used (0 to 1; NaN for a round of no time)."""
        if self.wall_seconds <= 0 or self.cores <= 0:
            return float("nan")
        other = self.other_process_cpu_seconds
        if other is None:
            other = self.machine_cpu_seconds - self.own_cpu_seconds
        return max(0.0, other) / (self.wall_seconds * self.cores)

    @property
    def unattributed_cpu_seconds(self) -> float:
        """The machine's busy time that neither the run nor any other process was charged for."""
        other = self.other_process_cpu_seconds or 0.0
        return max(0.0, self.machine_cpu_seconds - self.own_cpu_seconds - other)

    def as_dict(self) -> dict:
        return {**asdict(self), "other_cpu_share": self.other_cpu_share,
                "unattributed_cpu_seconds": self.unattributed_cpu_seconds}


@dataclass(frozen=True)
class Verdict:
    publishable: bool
    reasons: tuple[str, ...]


def verdict(load_average_1m: float, cores: int, rounds: list[RoundLoad]) -> Verdict:
    """Publishable when the load average at the start was at most LOAD_PER_CORE_LIMIT per core and no round saw
    other processes use more than OTHER_CPU_SHARE_LIMIT of the CPU. A round whose share cannot be told (no wall
    time) is no evidence of a quiet machine either, nor is a run with no watched round."""
    reasons = []
    if not rounds:
        reasons.append("no measured round was watched for other processes' CPU")
    per_core = load_average_1m / max(cores, 1)
    if per_core > LOAD_PER_CORE_LIMIT:
        reasons.append(f"load average {load_average_1m:.2f} at the start on {cores} cores: {per_core:.2f} per core "
                       f"(limit {LOAD_PER_CORE_LIMIT})")
    for entry in rounds:
        share = entry.other_cpu_share
        if math.isnan(share) or share > OTHER_CPU_SHARE_LIMIT:
            used = "an unknown share" if math.isnan(share) else f"{share:.0%}"
            reasons.append(f"{entry.label}: other processes used {used} of the CPU (limit {OTHER_CPU_SHARE_LIMIT:.0%})")
    return Verdict(not reasons, tuple(reasons))


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all cores (/proc/stat: everything but idle and iowait)."""
    t = psutil.cpu_times()
    return sum(getattr(t, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


def own_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and its descendants, living ones and those already reaped (a finished wrk or
    perf_analyzer is counted in its parent's children times, so no round loses its load generator)."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


ProcessKey = tuple[int, float]  # a process told apart from a later one with its pid: (pid, start time)


def tree_keys(pid: int, also_under: Iterable[ProcessKey] = ()) -> set[ProcessKey]:
    """`pid` and its descendants, and the descendants of each process of `also_under` still alive (one that left
    the tree keeps its own children). One pass over /proc."""
    children: dict[int, list[ProcessKey]] = {}
    alive: set[ProcessKey] = set()
    for proc in psutil.process_iter(["ppid", "create_time"]):
        key = (proc.pid, proc.info["create_time"])
        alive.add(key)
        children.setdefault(proc.info["ppid"], []).append(key)
    found = {key for key in alive if key[0] == pid}
    found |= alive & set(also_under)
    pending = list(found)
    while pending:
        for child in children.get(pending.pop()[0], ()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def other_processes(pid: int, own: Iterable[ProcessKey] = ()) -> dict[int, tuple[float, float]]:
    """Every process outside `pid`'s tree and outside `own` (processes the run started that have left its tree):
    its start time and CPU seconds so far."""
    own = set(own) | tree_keys(pid, own)
    found = {}
    for proc in psutil.process_iter():
        if proc.pid == pid:
            continue
        try:
            started = proc.create_time()
            if (proc.pid, started) in own:
                continue
            times = proc.cpu_times()
            found[proc.pid] = (started, times.user + times.system)
        except psutil.Error:
            continue
    return found


def other_cpu_seconds(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> float:
    """What the other processes used between two looks: each one's growth, all of a process started since (one
    that started and ended between the looks is not seen)."""
    total = 0.0
    for pid, (started, cpu) in after.items():
        earlier = before.get(pid)
        total += cpu - earlier[1] if earlier is not None and earlier[0] == started else cpu
    return max(0.0, total)


class LoadWatch:
    """The load of one run: the load average at its start and each round's other-process CPU. Everything this
    process started (the servers, their stubs, the load generators) is the run's own."""

    def __init__(self, pid: int | None = None, load_average_1m: float | None = None, cores: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        # Rounded as it is recorded, so that the verdict is the one a reader recomputes from results.json.
        self.load_average_1m = round(psutil.getloadavg()[0] if load_average_1m is None else load_average_1m, 2)
        self.cores = cores or psutil.cpu_count() or 1
        self.rounds: list[RoundLoad] = []
        # Every process seen in the run's tree while a round was watched (pid, start time), kept across rounds.
        self.own: set[ProcessKey] = set()

    @contextmanager
    def round(self, label: str) -> Iterator[None]:
        """The round's other-process CPU leaves out every process seen in the run's tree during it (sampled every
        TREE_SAMPLE_S), those that left the tree before its end included; a process never in the tree counts."""
        seen = self.own
        seen.update(tree_keys(self.pid, seen))
        others = other_processes(self.pid, seen)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(TREE_SAMPLE_S):
                seen.update(tree_keys(self.pid, seen))

        sampler = threading.Thread(target=sample, daemon=True)
        machine, own, wall = machine_cpu_seconds(), own_cpu_seconds(self.pid), time.monotonic()
        sampler.start()
        try:
            yield
        finally:
            ended = time.monotonic() - wall
            machine_used, own_used = machine_cpu_seconds() - machine, own_cpu_seconds(self.pid) - own
            done.set()
            sampler.join()
            seen.update(tree_keys(self.pid, seen))
            self.rounds.append(RoundLoad(label, ended, machine_used, own_used, self.cores,
                                         other_cpu_seconds(others, other_processes(self.pid, seen))))

    def summary(self) -> dict:
        found = verdict(self.load_average_1m, self.cores, self.rounds)
        return {"publishable": found.publishable, "reasons": list(found.reasons),
                "load_average_1m_at_start": round(self.load_average_1m, 2), "cores": self.cores,
                "limits": {"load_average_per_core": LOAD_PER_CORE_LIMIT, "other_cpu_share": OTHER_CPU_SHARE_LIMIT},
                "rounds": [r.as_dict() for r in self.rounds]}


def markdown_lines(summary: dict) -> list[str]:
    """The verdict as the first lines of a printed report."""
    if summary["publishable"]:
        worst = max((r["other_cpu_share"] for r in summary["rounds"]), default=0.0)
        return [f"**Publishable**: a quiet machine (load average {summary['load_average_1m_at_start']} at the start "
                f"on {summary['cores']} cores; other processes at most {worst:.0%} of the CPU in any round).", ""]
    return ["**NOT PUBLISHABLE: taken on a busy machine.** " + "; ".join(summary["reasons"]) + ".", ""]


def machine() -> dict:
    """What a run's figures were measured on, and how busy it was when the run began."""
    load1, load5, _ = psutil.getloadavg()
    return {"cpu": platform.processor() or _cpu_model(), "logical_cores": psutil.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "os": platform.platform(),
            "python": platform.python_version(), "load_average_at_start": [round(load1, 2), round(load5, 2)]}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine() or "unknown"
