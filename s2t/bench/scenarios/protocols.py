"""HTTP against gRPC on risk_pipeline, in alternating rounds: with the low-CPU generators (wrk on HTTP, h2load on
gRPC; the default) or with perf_analyzer on both sides.

One point per protocol, measured one after the other, compares two moments of a shared machine more than two
protocols: on the 2-core machine the gRPC/HTTP ratio of a single pair of rounds ranged from 0.66x to 1.44x within
minutes. Rounds that alternate the protocols, each figure the median round, put the machine's changes on both sides.
Each round also splits the CPU a request costs between the load generator, tritonserver's own process (its HTTP or
gRPC front end, the gRPC front that runs inside it, the batcher, the models it runs in process), a gRPC front of its
own process when there is one (s2t/serve/grpc_front.py) and the python stubs, which is where a protocol's cost shows when throughput does not. perf_analyzer spends several times wrk's CPU per request, taken from the server on a
small machine; the low-CPU pair leaves the cores to the server (each side's generator is in the results).
"""
from __future__ import annotations

import resource
import statistics
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from s2t.bench.load import h2load, perf_analyzer, wrk
from s2t.bench.harness import process_tree
from s2t.on_progress import OnProgress, no_progress

PROTOCOLS = ("http", "grpc")
# The load generator of each protocol, per choice of `s2t bench --protocol-clients` (the first: its default).
GENERATORS = {"low-cpu": {"http": "wrk", "grpc": "h2load"},
              "perf_analyzer": {"http": "perf_analyzer", "grpc": "perf_analyzer"}}


@dataclass(frozen=True)
class Load:
    """What each generator sends: perf_analyzer's input file and settings, wrk's script, h2load's framed body,
    and how long wrk and h2load run per round."""

    input_data: Path
    settings: perf_analyzer.Settings
    wrk_script: Path | None = None
    grpc_body: Path | None = None
    seconds: float = 5.0


def _drive(generator: str, url: str, protocol: str, model: str, load: Load, concurrency: int) -> dict:
    """One run of `generator`: req/s, latency and the generator's own CPU seconds."""
    if generator == "perf_analyzer":
        point = perf_analyzer.measure(url, protocol, model, load.input_data, load.settings, concurrency=concurrency)
        return {"requests_per_s": point.requests_per_s, "p50_ms": point.p50_ms, "p99_ms": point.p99_ms,
                "client_cpu_s": point.client_cpu_seconds}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if generator == "wrk":
        found = wrk.run("http://" + url, load.wrk_script, concurrency, load.seconds)
        figures = {"requests_per_s": found.throughput, "p50_ms": found.p50_ms, "p99_ms": found.p99_ms}
    else:  # h2load reports a mean, no percentiles
        found = h2load.run(url, load.grpc_body, concurrency, load.seconds)
        figures = {"requests_per_s": found.throughput, "p50_ms": float("nan"), "p99_ms": float("nan")}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**figures, "client_cpu_s": (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)}


def _round(pid: int, url: str, protocol: str, model: str, load: Load, generator: str, concurrency: int,
           count_requests: Callable[[], int], front_pid: int | None = None) -> dict:
    def front() -> float:
        return process_tree.own_cpu_seconds(front_pid) if front_pid else 0.0

    before, tree, own, grpc_front = (count_requests(), process_tree.cpu_seconds(pid),
                                     process_tree.own_cpu_seconds(pid), front())
    point = _drive(generator, url, protocol, model, load, concurrency)
    requests = max(count_requests() - before, 1)
    tree, own = process_tree.cpu_seconds(pid) - tree, process_tree.own_cpu_seconds(pid) - own
    grpc_front = front() - grpc_front

    def per_request_us(seconds: float) -> float:
        return round(1e6 * seconds / requests, 1)

    return {"requests_per_s": point["requests_per_s"], "p50_ms": point["p50_ms"], "p99_ms": point["p99_ms"],
            "requests": requests, "client_cpu_us_per_request": per_request_us(point["client_cpu_s"]),
            "server_cpu_us_per_request": per_request_us(tree + grpc_front),
            "front_end_cpu_us_per_request": per_request_us(own), "grpc_front_cpu_us_per_request": per_request_us(grpc_front),
            "stubs_cpu_us_per_request": per_request_us(tree - own)}


def median_of_rounds(entries: list[dict]) -> dict:
    return {key: statistics.median(e[key] for e in entries) for key in entries[0]}


def compare(pid: int, urls: dict[str, str], model: str, load: Load, concurrency: int, rounds: int,
            count_requests: Callable[[], int], log: Callable[[str], None] = print,
            on_progress: OnProgress = no_progress,
            watch: Callable[[str], ContextManager] = lambda label: nullcontext(),
            clients: str = "perf_analyzer", front_pid: int | None = None) -> dict:
    """`rounds` rounds of HTTP then gRPC at `concurrency`, each driven by its generator of GENERATORS[clients]; each
    protocol's median round (every key on its own) and the ratio of the median req/s. `on_progress` hears the
    rounds done, naming the one that runs; each round runs inside `watch(label)` (the run's machine-load record).
    `front_pid`: the gRPC front's process, whose CPU counts as the server's."""
    generators = GENERATORS[clients]
    measured: dict[str, list[dict]] = {protocol: [] for protocol in PROTOCOLS}
    total = rounds * len(PROTOCOLS)
    for number in range(rounds):
        for protocol in PROTOCOLS:
            label = f"{generators[protocol]} {model} {protocol} c={concurrency} round {number + 1}"
            on_progress(sum(map(len, measured.values())), total, label)
            with watch(label):
                entry = _round(pid, urls[protocol], protocol, model, load, generators[protocol], concurrency,
                               count_requests, front_pid)
            measured[protocol].append(entry)
            log(f"{model} {protocol} c={concurrency} round {number + 1}: {entry['requests_per_s']:.0f} req/s, "
                f"CPU us/request client {entry['client_cpu_us_per_request']:.0f}, tritonserver "
                f"{entry['front_end_cpu_us_per_request']:.0f}, gRPC front {entry['grpc_front_cpu_us_per_request']:.0f}, "
                f"stubs {entry['stubs_cpu_us_per_request']:.0f}")
    medians = {protocol: median_of_rounds(entries) for protocol, entries in measured.items()}
    return {"model": model, "concurrency": concurrency, "generators": dict(generators), "rounds": measured,
            "median": medians,
            "grpc_vs_http": medians["grpc"]["requests_per_s"] / medians["http"]["requests_per_s"]}
