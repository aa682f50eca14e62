"""perf_analyzer (from the tritonclient 2.51.0 wheel) as a function: one measurement point per call, parsed from
its CSV report. It needs Debian's libb64-0d and the CUDA runtime library of nvidia-cuda-runtime-cu12 (it links
against libcudart even on a CPU-only host); both are installed by `make venv`."""
from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """How long each point is measured: windows of at least `requests` answered requests, until three in a row
    agree within `stability_percent`. Windows by count, not by time: a model with a queue policy (risk_router) now
    and then has its requests held about 500 ms (docs/benchmarks.md, "Golden parameters"), and a
    time window that caught no answer makes perf_analyzer give up. Loose stability on purpose: the load generator
    shares the 2 cores with the server (and the machine with other work), so windows vary far more than
    perf_analyzer's default 10%."""

    requests: int
    max_trials: int = 5
    stability_percent: int = 999
    # Time windows of this many milliseconds instead, where every model measured carries no queue policy and the
    # point's figures are not published (the smoke run): a count window lasts at least a second, three per point.
    window_ms: int | None = None

    def window_args(self) -> list[str]:
        if self.window_ms is not None:
            return ["--measurement-mode", "time_windows", "--measurement-interval", str(self.window_ms)]
        return ["--measurement-mode", "count_windows", "--measurement-request-count", str(self.requests)]


@dataclass(frozen=True)
class Point:
    model: str
    protocol: str
    batch: int
    concurrency: int | None
    request_rate: float | None
    infer_per_s: float  # rows per second (perf_analyzer's "Inferences/Second" counts batch elements)
    p50_ms: float
    p90_ms: float
    p99_ms: float
    avg_ms: float
    server_queue_ms: float
    server_compute_ms: float

    @property
    def requests_per_s(self) -> float:
        return self.infer_per_s / self.batch

    def as_dict(self) -> dict:
        return {**asdict(self), "requests_per_s": self.requests_per_s}


def binary() -> Path:
    return Path(sys.executable).parent / "perf_analyzer"


def environment() -> dict[str, str]:
    import nvidia.cuda_runtime
    lib = Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH")) if p)
    return env


def parse_csv(text: str, model: str, protocol: str, batch: int) -> Point:
    row = next(csv.DictReader(io.StringIO(text)))
    us = lambda key: float(row.get(key) or "nan") / 1000.0  # noqa: E731 - perf_analyzer writes microseconds
    compute = sum(us(k) for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
    return Point(
        model=model, protocol=protocol, batch=batch,
        concurrency=int(row["Concurrency"]) if "Concurrency" in row else None,
        request_rate=float(row["Request Rate"]) if "Request Rate" in row else None,
        infer_per_s=float(row["Inferences/Second"]),
        p50_ms=us("p50 latency"), p90_ms=us("p90 latency"), p99_ms=us("p99 latency"), avg_ms=us("Avg latency"),
        server_queue_ms=us("Server Queue"), server_compute_ms=compute)


def measure(url: str, protocol: str, model: str, input_data: Path, settings: Settings, *, batch: int = 1,
            concurrency: int | None = None, request_rate: float | None = None) -> Point:
    """One point: a fixed concurrency (closed loop) or a fixed request rate (open loop, Poisson-free constant)."""
    if (concurrency is None) == (request_rate is None):
        raise ValueError("give a concurrency or a request rate")
    with tempfile.TemporaryDirectory(prefix="s2t-perf-") as tmp:
        report = Path(tmp) / "report.csv"
        cmd = [str(binary()), "-m", model, "-u", url, "-i", protocol, "-b", str(batch),
               "--input-data", str(input_data), *settings.window_args(), "-r", str(settings.max_trials),
               "-s", str(settings.stability_percent), "-f", str(report)]
        if concurrency is not None:
            cmd += ["--concurrency-range", f"{concurrency}:{concurrency}"]
        else:
            cmd += ["--request-rate-range", f"{request_rate:g}:{request_rate:g}"]
        proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not report.exists():
            raise RuntimeError(f"perf_analyzer failed ({proc.returncode}) on {model} {protocol}:\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
        return parse_csv(report.read_text(), model, protocol, batch)
