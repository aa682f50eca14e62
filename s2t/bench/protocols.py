"""HTTP against gRPC on risk_pipeline with the same load generator (perf_analyzer), in alternating rounds.

One point per protocol, measured one after the other, compares two moments of a shared machine more than two
protocols: on the 2-core machine the gRPC/HTTP ratio of a single pair of rounds ranged from 0.66x to 1.44x within
minutes. Rounds that alternate the protocols, each figure the median round, put the machine's changes on both
sides. Each round also splits the CPU a request costs between the load generator, tritonserver's own process (its
HTTP or gRPC front end, the batcher) and the python stubs, which is where a protocol's cost shows when throughput
does not.
"""
from __future__ import annotations

import statistics
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager

from s2t.bench import perf_analyzer, process_tree
from s2t.on_progress import OnProgress, no_progress

PROTOCOLS = ("http", "grpc")


def _round(pid: int, url: str, protocol: str, model: str, input_data: Path, settings: perf_analyzer.Settings,
           concurrency: int, count_requests: Callable[[], int]) -> dict:
    before, tree, own = count_requests(), process_tree.cpu_seconds(pid), process_tree.own_cpu_seconds(pid)
    point = perf_analyzer.measure(url, protocol, model, input_data, settings, concurrency=concurrency)
    requests = max(count_requests() - before, 1)
    tree, own = process_tree.cpu_seconds(pid) - tree, process_tree.own_cpu_seconds(pid) - own

    def per_request_us(seconds: float) -> float:
        return round(1e6 * seconds / requests, 1)

    return {"requests_per_s": point.requests_per_s, "p50_ms": point.p50_ms, "p99_ms": point.p99_ms,
            "requests": requests, "client_cpu_us_per_request": per_request_us(point.client_cpu_seconds),
            "server_cpu_us_per_request": per_request_us(tree),
            "front_end_cpu_us_per_request": per_request_us(own), "stubs_cpu_us_per_request": per_request_us(tree - own)}


def median_of_rounds(entries: list[dict]) -> dict:
    return {key: statistics.median(e[key] for e in entries) for key in entries[0]}


def compare(pid: int, urls: dict[str, str], model: str, input_data: Path, settings: perf_analyzer.Settings,
            concurrency: int, rounds: int, count_requests: Callable[[], int],
            log: Callable[[str], None] = print, on_progress: OnProgress = no_progress,
            watch: Callable[[str], ContextManager] = lambda label: nullcontext()) -> dict:
    """`rounds` rounds of HTTP then gRPC at `concurrency`; each protocol's median round (every key on its own) and
    the ratio of the median req/s. `on_progress` hears the rounds done, naming the one that runs; each round runs
    inside `watch(label)` (the run's machine-load record)."""
    measured: dict[str, list[dict]] = {protocol: [] for protocol in PROTOCOLS}
    total = rounds * len(PROTOCOLS)
    for number in range(rounds):
        for protocol in PROTOCOLS:
            label = f"perf_analyzer {model} {protocol} c={concurrency} round {number + 1}"
            on_progress(sum(map(len, measured.values())), total, label)
            with watch(label):
                entry = _round(pid, urls[protocol], protocol, model, input_data, settings, concurrency, count_requests)
            measured[protocol].append(entry)
            log(f"{model} {protocol} c={concurrency} round {number + 1}: {entry['requests_per_s']:.0f} req/s, "
                f"CPU us/request client {entry['client_cpu_us_per_request']:.0f}, front end "
                f"{entry['front_end_cpu_us_per_request']:.0f}, stubs {entry['stubs_cpu_us_per_request']:.0f}")
    medians = {protocol: median_of_rounds(entries) for protocol, entries in measured.items()}
    return {"model": model, "concurrency": concurrency, "rounds": measured, "median": medians,
            "grpc_vs_http": medians["grpc"]["requests_per_s"] / medians["http"]["requests_per_s"]}
