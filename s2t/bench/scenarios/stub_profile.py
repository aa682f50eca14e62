"""Where a python model's time goes under load: py-spy on the process running its model.py, and Triton's own
per-model statistics.

py-spy samples the interpreter from outside, without changing it: a python-backend model's stub process (the
samples with no Python frame are the stub's C++ side: reading requests from shared memory, sending responses), or
for a model on the in-process backend the server process itself (its Python runs on the instance's thread).
Triton's statistics split each execution into queue, compute input, compute infer and compute output.
"""
from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from s2t.triton_admin import TritonAdmin
from s2t.triton_config import INPROCESS_BACKEND

NATIVE = "(no Python frame)"
STAGES = ("compute_input", "compute_infer", "compute_output")


def python_pid(server_pid: int, http_url: str, model: str) -> int:
    """The process whose interpreter runs `model`'s model.py: the server's own on the in-process backend, else the
    stub of its first instance."""
    if TritonAdmin(http_url).model_config(model).get("backend") == INPROCESS_BACKEND:
        return server_pid
    return stub_pid(server_pid, model)


def stub_pid(server_pid: int, model: str) -> int:
    """The stub process of `model`'s first instance (its command line names `<model>_0_0`)."""
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            if any(arg.startswith(f"{model}_0_0") for arg in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError(f"no stub process for {model} under pid {server_pid}")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).is_file():
        raise RuntimeError("py-spy is not installed (pip install py-spy, pinned in constraints.txt)")
    return found


def start(pid: int, seconds: float, out: Path, rate: int = 250) -> subprocess.Popen:
    """py-spy record in raw (collapsed stacks) form; returns the process, which ends after `seconds`."""
    return subprocess.Popen([py_spy(), "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", str(rate),
                             "-f", "raw", "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def summarize(collapsed: str, top: int = 15) -> dict:
    """Self time per frame (the last one of each stack) and time inside each function of `model.py` or
    `backends/`, as shares of all samples."""
    self_time, inside, total = collections.Counter(), collections.Counter(), 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n, frames = int(count), [f for f in stack.split(";") if f]
        total += n
        self_time[_function(frames[-1]) if frames else NATIVE] += n
        for name in {_function(f) for f in frames if "model.py" in f or "backends/" in f or "onnxruntime" in f}:
            inside[name] += n

    def share(counts: collections.Counter) -> list[dict]:
        return [{"frame": f, "share": n / total} for f, n in counts.most_common(top)] if total else []

    return {"samples": total, "self": share(self_time), "inclusive": share(inside)}


def _function(frame: str) -> str:
    """`execute (model.py:37)` -> `execute (model.py)`: lines of one function count together."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].split('/')[-1]})" if where else name


STAGES = ("compute_input", "compute_infer", "compute_output")


def snapshot(http_url: str, model: str) -> collections.Counter:
    """Triton's cumulative counters of `model`: requests, executions (batches), and nanoseconds per stage."""
    stats = TritonAdmin(http_url).model_stats(model)
    counters = collections.Counter()
    for version in stats:
        counters["requests"] += int(version["inference_stats"]["success"]["count"])
        counters["queue"] += int(version["inference_stats"]["queue"]["ns"])
        # Request-level compute figures repeat the batch's time for every request in it: per execution, the
        # batch statistics are the right source.
        for batch in version.get("batch_stats", []):
            counters["executions"] += int(batch["compute_infer"]["count"])
            for stage in STAGES:
                counters[stage] += int(batch[stage]["ns"])
    return counters


def breakdown(before: collections.Counter, after: collections.Counter) -> dict:
    """What happened between two snapshots: mean batch, queue wait per request, compute stages per execution
    and per request (microseconds)."""
    d = after - before
    requests, executions = max(d["requests"], 1), max(d["executions"], 1)
    return {"requests": d["requests"], "executions": d["executions"], "mean_batch": d["requests"] / executions,
            "queue_us_per_request": d["queue"] / requests / 1e3,
            "per_execution_us": {stage: d[stage] / executions / 1e3 for stage in STAGES},
            "per_request_us": {stage: d[stage] / requests / 1e3 for stage in STAGES}}
