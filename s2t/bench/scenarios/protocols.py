"""HTTP against gRPC on risk_pipeline, in rounds taken in turns: with the low-CPU generators (wrk on HTTP, h2load on
gRPC; the default) or with perf_analyzer on both sides.

One point per protocol, measured one after the other, compares two moments of a shared machine more than two
protocols: on the 2-core machine the gRPC/HTTP ratio of a single pair of rounds ranged from 0.66x to 1.44x within
minutes. Rounds that take turns (rounds.take_turns, the order rotating), each figure the median round, put the
machine's changes on both sides. Each round also splits the CPU a request costs between the load generator,
tritonserver's own process (its HTTP or gRPC front end, the gRPC front that runs inside it, the batcher, the models
it runs in process), a gRPC front of its own process when there is one (s2t/serve/grpc_front.py) and the python
stubs, which is where a protocol's cost shows when throughput does not. Answers are Triton's count of successful
requests (load/generators.py): wrk and h2load send the same one record, perf_analyzer every record on both sides.
perf_analyzer spends several times wrk's CPU per request, taken from the server on a small machine; the low-CPU
pair leaves the cores to the server (each side's generator is in the results).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

from s2t.bench.harness import rounds as turns
from s2t.bench.load.generators import Load, drive, measured_round
from s2t.on_progress import OnProgress, no_progress

__all__ = ["GENERATORS", "Load", "PROTOCOLS", "compare"]

PROTOCOLS = ("http", "grpc")
# The load generator of each protocol, per choice of `s2t bench --protocol-clients` (the first: its default).
GENERATORS = {"low-cpu": {"http": "wrk", "grpc": "h2load"},
              "perf_analyzer": {"http": "perf_analyzer", "grpc": "perf_analyzer"}}


def compare(pid: int, urls: dict[str, str], model: str, load: Load, concurrency: int, rounds: int,
            count_requests: Callable[[], int], log: Callable[[str], None] = print,
            on_progress: OnProgress = no_progress,
            watch: Callable[[str], ContextManager] = lambda label: nullcontext(),
            clients: str = "perf_analyzer", front_pid: int | None = None) -> dict:
    """`rounds` rounds of HTTP and gRPC at `concurrency`, taking turns, each driven by its generator of
    GENERATORS[clients]; each protocol's median round (by req/s, whole) and the ratio of the median req/s.
    `on_progress` hears the rounds done, naming the one that runs; each round runs inside `watch(label)` (the run's
    machine-load record). `count_requests`: Triton's running count of answered requests; `front_pid`: the gRPC
    front's process, whose CPU counts as the server's."""
    generators = GENERATORS[clients]
    total, done = rounds * len(PROTOCOLS), []

    def one(protocol: str, number: int) -> dict:
        label = f"{generators[protocol]} {model} {protocol} c={concurrency} round {number + 1}"
        on_progress(len(done), total, label)
        with watch(label):
            entry = measured_round(pid, lambda: drive(generators[protocol], urls[protocol], protocol, model, load,
                                                      concurrency), count_requests, front_pid)
        done.append(label)
        log(f"{model} {protocol} c={concurrency} round {number + 1}: {entry['requests_per_s']:.0f} req/s, "
            f"CPU us/request client {entry['client_cpu_us_per_request']:.0f}, tritonserver "
            f"{entry['front_end_cpu_us_per_request']:.0f}, gRPC front {entry['grpc_front_cpu_us_per_request']:.0f}, "
            f"stubs {entry['stubs_cpu_us_per_request']:.0f}")
        return entry

    measured = turns.take_turns(PROTOCOLS, rounds, one)
    medians = {protocol: turns.median_round(entries, "requests_per_s") for protocol, entries in measured.items()}
    return {"model": model, "concurrency": concurrency, "generators": dict(generators), "rounds": measured,
            "median": medians,
            "grpc_vs_http": medians["grpc"]["requests_per_s"] / medians["http"]["requests_per_s"]}
