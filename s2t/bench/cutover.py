"""`s2t bench --mode cutover`: the legacy service against skill2triton through the same legacy protocol, with the
same client, on the same machine, one after the other (never both loaded at once).

Three columns: the legacy service (`s2t legacy serve`: TensorFlow, windows of 128, 8 threads); skill2triton as
legacy callers reach it (`s2t gateway` in front of Triton's `risk_pipeline`); and Triton directly (the same records
as one `risk_pipeline` request over gRPC, what a caller moved to Triton's own protocol sends). One call is
`records_per_call` German Credit records. Latency: one caller, calls back to back. Throughput: `callers` callers in
a closed loop. Memory: peak RSS of each service's whole process tree (tritonserver and its stubs; the gateway
counted with Triton). Cold start: process start until it answers (the legacy service's "listening" line comes after
it loaded and warmed the SavedModel; Triton's is all models ready; the gateway path's, Triton's plus the gateway's
own start to its "ready" line). The gateway runs with exactly `callers` call slots: no call is refused.
"""
from __future__ import annotations

import platform
import threading
import time
from dataclasses import asdict, dataclass
from itertools import cycle
from pathlib import Path
from typing import Callable

import grpc
import numpy as np
import psutil

from clients.legacy_record import to_protobuf
from wire import skill_pb2, skill_pb2_grpc
from s2t.models import german_credit
from s2t.serve import service_process
from s2t.bench import process_tree, report
from s2t.bench.latency import LatencySummary
from s2t.on_progress import OnProgress, no_progress
from s2t.serve.triton_server import TritonServer, free_port
from wire.names import PAYLOAD

MB = 2**20
# The legacy service's start, the gateway's, Triton's, and a latency and a throughput run on each of the three sides.
STEPS = 9
# The migration this project repeats, as its design document reports it (legacy -> Triton).
DESIGN_DOCUMENT = {"avg_latency_ms": (89, 63), "throughput_qps": (8_200, 14_700), "peak_memory_gb": (4.3, 2.8),
                   "cold_start_s": (6.2, 1.8)}


@dataclass(frozen=True)
class CutoverPlan:
    records_per_call: int = 32
    latency_seconds: float = 15.0
    throughput_seconds: float = 15.0
    callers: int = 8


PLANS = {"cutover": CutoverPlan(), "smoke": CutoverPlan(latency_seconds=1.0, throughput_seconds=2.0)}


@dataclass
class LoadResult:
    calls: int
    records: int
    seconds: float
    avg_ms: float
    p50_ms: float
    p99_ms: float
    errors: int
    error_reasons: dict

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


class PeakRss:
    """Largest summed RSS of the process trees rooted at `pids`, sampled every 0.2 s while in the `with` block."""

    def __init__(self, pids: list[int]):
        self.pids, self.peak = pids, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, sum(process_tree.rss_bytes(pid) for pid in self.pids))
            if self._done.wait(0.2):
                return

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def closed_loop(make_call: Callable[[], Callable[[list], None]], batches: list, callers: int,
                seconds: float) -> LoadResult:
    """`callers` threads, each with its own client (`make_call()`), sending batches back to back for `seconds`."""
    latencies: list[float] = []
    counts = {"records": 0, "errors": 0}
    reasons: dict[str, int] = {}
    lock = threading.Lock()
    start_line = threading.Barrier(callers + 1)
    stop_at = [0.0]

    def caller(offset: int) -> None:
        call = make_call()
        mine, records, errors, why = [], 0, 0, {}
        start_line.wait()
        for batch in cycle(batches[offset:] + batches[:offset]):
            if time.perf_counter() >= stop_at[0]:
                break
            began = time.perf_counter()
            try:
                call(batch)
            except Exception as err:  # noqa: BLE001 - counted; a benchmark reports failures instead of stopping
                errors += 1
                reason = err.code().name if isinstance(err, grpc.RpcError) else type(err).__name__
                why[reason] = why.get(reason, 0) + 1
                continue
            mine.append(time.perf_counter() - began)
            records += len(batch)
        with lock:
            latencies.extend(mine)
            counts["records"] += records
            counts["errors"] += errors
            for reason, n in why.items():
                reasons[reason] = reasons.get(reason, 0) + n

    threads = [threading.Thread(target=caller, args=(i * 7 % len(batches),), daemon=True) for i in range(callers)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start_line.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    latency = LatencySummary.of_seconds(latencies)
    return LoadResult(latency.calls, counts["records"], elapsed, latency.mean_ms, latency.p50_ms, latency.p99_ms,
                      counts["errors"], reasons)


def skill_caller(port: int) -> Callable[[], Callable[[list], None]]:
    def make():
        stub = skill_pb2_grpc.SkillStub(grpc.insecure_channel(f"localhost:{port}"))

        def call(batch):
            result = stub.Score(iter(batch), timeout=60)
            if len(result.results) != len(batch) or any(r.status != skill_pb2.OK for r in result.results):
                raise RuntimeError("a record was not scored")
        return call
    return make


def triton_caller(grpc_url: str) -> Callable[[], Callable[[list], None]]:
    import tritonclient.grpc as grpcclient

    def make():
        client = grpcclient.InferenceServerClient(grpc_url)

        def call(batch):
            tensor = grpcclient.InferInput(PAYLOAD, [len(batch), 1], "BYTES")
            tensor.set_data_from_numpy(np.array([r.SerializeToString() for r in batch], dtype=object).reshape(-1, 1))
            client.infer("risk_pipeline", [tensor], client_timeout=60)
        return call
    return make


def _measure(name: str, make_call, batches: list, plan: CutoverPlan, pids: list[int], log,
             begin: Callable[[str], None]) -> dict:
    """`begin` hears each run as it starts (the progress of the whole plan)."""
    # First calls open connections and warm caches on every side; cold start is measured apart.
    warm = make_call()
    for batch in batches[:20]:
        warm(batch)
    log(f"{name}: latency, 1 caller, {plan.latency_seconds:g} s")
    begin(f"{name}: latency")
    latency = closed_loop(make_call, batches, 1, plan.latency_seconds)
    log(f"{name}: throughput, {plan.callers} callers, {plan.throughput_seconds:g} s")
    begin(f"{name}: throughput")
    with PeakRss(pids) as peak:
        throughput = closed_loop(make_call, batches, plan.callers, plan.throughput_seconds)
    return {"latency": asdict(latency), "throughput": asdict(throughput),
            "records_per_s": throughput.records_per_s, "calls_per_s": throughput.calls / throughput.seconds,
            "peak_rss_bytes": peak.peak}


def _timed_start(args: list[str], ready: str) -> tuple[object, float]:
    began = time.perf_counter()
    process, _ = service_process.start(args, ready, timeout=300)
    return process, time.perf_counter() - began


def run(plan: CutoverPlan, out_dir: Path, repositories: list[Path], data_csv: Path, saved_model: Path,
        log=print, on_progress: OnProgress = no_progress) -> dict:
    """`on_progress` hears the STEPS done, naming the one that runs."""
    data = german_credit.load(data_csv)
    records = [to_protobuf({"request_id": f"b-{i}", "features": f}) for i, f in enumerate(data.records())]
    size = plan.records_per_call
    batches = [records[i:i + size] for i in range(0, len(records) - size + 1, size)]
    results = {"machine": machine(), "plan": asdict(plan)}
    begun = []

    def begin(label: str) -> None:
        on_progress(len(begun), STEPS, label)
        begun.append(label)

    legacy_port = free_port()
    begin("legacy service starting")
    legacy, cold = _timed_start(["legacy", "serve", "--port", str(legacy_port), "--saved-model", str(saved_model)],
                                "listening")
    try:
        results["legacy"] = {"cold_start_s": cold, **_measure("legacy service", skill_caller(legacy_port), batches,
                                                              plan, [legacy.pid], log, begin)}
    finally:
        service_process.stop(legacy)

    out_dir.mkdir(parents=True, exist_ok=True)
    triton = TritonServer(repositories, free_port(), free_port(), free_port(), log_path=out_dir / "tritonserver.log")
    begin("tritonserver starting")
    began = time.perf_counter()
    triton.start(timeout=300)
    triton_cold = time.perf_counter() - began
    try:
        gateway_port = free_port()
        begin("gateway starting")
        gateway, gateway_cold = _timed_start(["gateway", "--port", str(gateway_port), "--grpc-url", triton.grpc_url,
                                              "--window-size", str(size),
                                              # Exactly the callers: a slot is free again before its call's answer
                                              # leaves, so a caller's next call is never refused.
                                              "--workers", str(plan.callers)], "ready")
        try:
            results["gateway"] = {"cold_start_s": triton_cold + gateway_cold, "gateway_start_s": gateway_cold,
                                  **_measure("gateway -> Triton", skill_caller(gateway_port), batches, plan,
                                             [triton.process.pid, gateway.pid], log, begin)}
        finally:
            service_process.stop(gateway)
        results["triton"] = {"cold_start_s": triton_cold,
                             **_measure("Triton directly", triton_caller(triton.grpc_url), batches, plan,
                                        [triton.process.pid], log, begin)}
    finally:
        triton.stop()
    report.write_files(out_dir, results, table(results))
    on_progress(len(begun), STEPS, f"results in {out_dir}")
    return results


def machine() -> dict:
    load1, load5, _ = psutil.getloadavg()
    return {"cpu": platform.processor() or platform.machine(), "logical_cores": psutil.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "os": platform.platform(),
            "load_average_at_start": [round(load1, 2), round(load5, 2)]}


def cold_start(side: dict) -> str:
    """Launch until it answers; the gateway's own share after Triton's, when it is the gateway path."""
    own = side.get("gateway_start_s")
    return f"{side['cold_start_s']:.1f}" + (f" (gateway {own:.2f})" if own is not None else "")


def table(results: dict) -> str:
    legacy, gateway, triton = results["legacy"], results["gateway"], results["triton"]
    plan = results["plan"]
    doc = DESIGN_DOCUMENT

    def row(label, fmt, doc_pair=None):
        values = [fmt(side) for side in (legacy, gateway, triton)]
        design = f"{doc_pair[0]} -> {doc_pair[1]}" if doc_pair else ""
        return f"| {label} | {' | '.join(values)} | {design} |"

    lines = [
        f"Calls of {plan['records_per_call']} German Credit records; latency with 1 caller, throughput with "
        f"{plan['callers']} callers in a closed loop; machine: {results['machine']['logical_cores']} cores, "
        f"{results['machine']['os']}, load generator on the same cores.",
        "",
        "| measured | legacy service (TensorFlow) | skill2triton (gateway -> Triton) | Triton directly (gRPC) "
        "| design document (legacy -> Triton) |",
        "|---|---|---|---|---|",
        row("average latency per call, ms", lambda s: f"{s['latency']['avg_ms']:.1f}", doc["avg_latency_ms"]),
        row("p99 latency per call, ms", lambda s: f"{s['latency']['p99_ms']:.1f}"),
        row(f"max throughput, records/s ({plan['callers']} callers)", lambda s: f"{s['records_per_s']:,.0f}",
            doc["throughput_qps"]),
        row("p99 latency at max throughput, ms", lambda s: f"{s['throughput']['p99_ms']:.1f}"),
        row("peak memory, RSS of the process tree, MB", lambda s: f"{s['peak_rss_bytes'] / MB:,.0f}",
            (f"{doc['peak_memory_gb'][0]} GB", f"{doc['peak_memory_gb'][1]} GB")),
        row("cold start, s", cold_start, doc["cold_start_s"]),
        row("failed calls (latency / throughput runs)",
            lambda s: f"{s['latency']['errors']} / {s['throughput']['errors']}"),
        row("of which refused RESOURCE_EXHAUSTED", lambda s: str(sum(
            run["error_reasons"].get("RESOURCE_EXHAUSTED", 0) for run in (s["latency"], s["throughput"])))),
    ]
    return "\n".join(lines)
