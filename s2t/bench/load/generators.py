"""One way to run a load generator against risk_pipeline for one round, and to read what the round cost.

Every comparison of Triton sides (HTTP against gRPC, `--mode cpu-cost`) drives its generators here, so each figure
means the same thing whoever asks: answers are Triton's own count of successful requests over the round (wrk counts
non-2xx answers as requests, and h2load counts a gRPC error as a success: it travels in an HTTP/2 200's trailers),
and the CPU of the server, its gRPC front and the generator is split one way (process_tree.CpuSplit).

Like for like: wrk and h2load send the same one record (h2load sends one framed body again and again, so the wrk
script fed beside it carries that record alone); perf_analyzer cycles through every record on both protocols.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from s2t.bench.harness import process_tree
from s2t.bench.load import h2load, perf_analyzer, wrk

GENERATORS = ("wrk", "h2load", "perf_analyzer")
# The protocols each generator speaks (wrk: HTTP only, h2load: gRPC only).
SPEAKS = {"wrk": ("http",), "h2load": ("grpc",), "perf_analyzer": ("http", "grpc")}


@dataclass(frozen=True)
class Load:
    """What each generator sends: perf_analyzer's input file and settings, wrk's script, h2load's framed body,
    and how long wrk and h2load run per round."""

    input_data: Path
    settings: perf_analyzer.Settings
    wrk_script: Path | None = None
    grpc_body: Path | None = None
    seconds: float = 5.0


def drive(generator: str, url: str, protocol: str, model: str, load: Load, concurrency: int,
          seconds: float | None = None) -> dict:
    """One run of `generator` at `concurrency` on `url` (host:port): the generator's own req/s, latencies and
    errors, and how long it ran (`seconds`: wrk and h2load's duration, `load.seconds` unless given)."""
    if protocol not in SPEAKS[generator]:
        raise ValueError(f"{generator} speaks {' or '.join(SPEAKS[generator])}, not {protocol}")
    duration = load.seconds if seconds is None else seconds
    if generator == "wrk":
        found = wrk.run("http://" + url, load.wrk_script, concurrency, duration)
        return {"requests_per_s": found.throughput, "p50_ms": found.p50_ms, "p99_ms": found.p99_ms,
                "mean_ms": found.mean_ms, "errors": found.errors, "seconds": found.seconds}
    if generator == "h2load":  # a mean, no percentiles
        found = h2load.run(url, load.grpc_body, concurrency, duration)
        return {"requests_per_s": found.throughput, "p50_ms": float("nan"), "p99_ms": float("nan"),
                "mean_ms": found.mean_ms, "errors": found.failed, "seconds": found.seconds}
    point = perf_analyzer.measure(url, protocol, model, load.input_data, load.settings, concurrency=concurrency)
    return {"requests_per_s": point.requests_per_s, "p50_ms": point.p50_ms, "p99_ms": point.p99_ms,
            "mean_ms": point.avg_ms, "errors": 0, "seconds": float("nan")}


def measured_round(pid: int, run: Callable[[], dict], answered: Callable[[], int],
                   front_pid: int | None = None) -> dict:
    """`run()` (a `drive`) with the server tree rooted at `pid` watched: the generator's figures, the requests
    Triton answered successfully over the round (`answered()`: its running count) and the CPU per request, split.
    wrk's and h2load's req/s become Triton's answers over their duration: errors are never throughput.
    perf_analyzer's own rate stands (its run holds warm-up and trial windows beside the measured one; it stops
    at the first error)."""
    before = answered()
    with process_tree.CpuSplit(pid, front_pid) as cpu:
        figures = run()
    requests = max(answered() - before, 0)
    if figures.get("seconds") and figures["seconds"] == figures["seconds"]:
        figures = {**figures, "generator_requests_per_s": figures["requests_per_s"],
                   "requests_per_s": requests / figures["seconds"]}
    return {**figures, "requests": requests, **cpu.per_request(requests)}
