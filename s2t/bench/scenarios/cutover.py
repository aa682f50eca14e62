"""`s2t bench --mode cutover`: the legacy service against skill2triton through the same legacy protocol, with the
same client, on the same machine: all three sides up at once and measured in turns (legacy, gateway, Triton
directly, then again), so that each side samples the same moments of the machine; a virtual machine's speed drifts
by several times within minutes, and one side measured after the other compared the drift as much as the sides.

Three columns: the legacy service (`s2t legacy serve`: TensorFlow, windows of 128, 8 threads); skill2triton as
legacy callers reach it (`s2t gateway` in front of Triton's `risk_pipeline`); and Triton directly (the same records
as one `risk_pipeline` request over gRPC, what a caller moved to Triton's own protocol sends). One call is
`records_per_call` German Credit records. Latency: one caller, calls back to back. Throughput: `callers` callers in
a closed loop. Each side's figures pool the calls of all its rounds. Memory: peak RSS of each service's whole
process tree (tritonserver and its stubs; the gateway counted with Triton, and `s2t serve` with its tritonserver and
stubs). Cold start: the command's launch until it
answers, the clock a user sees (the legacy service's "listening" line comes after it loaded and warmed the
SavedModel; Triton's is `s2t serve`'s "ready" line, every model ready; the gateway path's, that plus the gateway's
own start to its "ready" line). The gateway runs with exactly `callers` call slots: no call is refused.

Every measured run is watched for the machine's load (s2t/bench/harness/machine_load.py): results.json and the table say
whether the run is publishable, and the acceptance (s2t/bench/scenarios/cutover_acceptance.py) is printed as pass/fail lines.
Answers are compared record by record, gateway path and Triton directly against the legacy service.
"""
from __future__ import annotations

import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from itertools import cycle
from pathlib import Path
from typing import Callable

import grpc
import numpy as np
import psutil

from s2t.clients.legacy_record import to_protobuf
from s2t.wire import skill_pb2, skill_pb2_grpc
from s2t.models import dataset
from s2t.serve import service_process
from s2t.bench.scenarios import cutover_acceptance
from s2t.bench.harness import machine_load, process_tree, report
from s2t.bench.harness.latency import LatencySummary
from s2t.bench.harness.machine_load import LoadWatch, machine
from s2t.bench.harness.repository import copy_repositories
from s2t.bench.harness.rounds import take_turns
from s2t.on_progress import OnProgress, no_progress
from s2t.serve.triton_server import free_port
from s2t.wire.names import PAYLOAD

MB = 2**20
SIDES = ("legacy service", "gateway -> Triton", "Triton directly")
# The migration this project repeats, as its design document reports it (legacy -> Triton).
DESIGN_DOCUMENT = {"avg_latency_ms": (89, 63), "throughput_qps": (8_200, 14_700), "peak_memory_gb": (4.3, 2.8),
                   "cold_start_s": (6.2, 1.8)}


@dataclass(frozen=True)
class CutoverPlan:
    records_per_call: int = 32
    # Per side, over all its rounds.
    latency_seconds: float = 15.0
    throughput_seconds: float = 15.0
    callers: int = 8
    rounds: int = 3

    @property
    def steps(self) -> int:
        """The legacy service's start, `s2t serve`'s, the gateway's, then a latency and a throughput run on each
        side in every round."""
        return 3 + 2 * len(SIDES) * self.rounds


PLANS = {"cutover": CutoverPlan(), "smoke": CutoverPlan(latency_seconds=1.0, throughput_seconds=1.0, rounds=2)}


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


@dataclass(frozen=True)
class CallLog:
    """What one or more closed-loop runs saw, call by call: pooled over rounds before it is summarised."""
    latencies_s: list
    records: int
    seconds: float
    errors: int
    error_reasons: dict

    def add(self, other: "CallLog") -> "CallLog":
        reasons = dict(self.error_reasons)
        for reason, n in other.error_reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
        return CallLog(self.latencies_s + other.latencies_s, self.records + other.records,
                       self.seconds + other.seconds, self.errors + other.errors, reasons)

    def summary(self) -> LoadResult:
        latency = LatencySummary.of_seconds(self.latencies_s)
        return LoadResult(latency.calls, self.records, self.seconds, latency.mean_ms, latency.p50_ms, latency.p99_ms,
                          self.errors, self.error_reasons)


NO_CALLS = CallLog([], 0, 0.0, 0, {})


def closed_loop_calls(make_call: Callable[[], Callable[[list], None]], batches: list, callers: int,
                      seconds: float) -> CallLog:
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
    return CallLog(latencies, counts["records"], elapsed, counts["errors"], reasons)


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


def skill_scores(port: int, batches: list) -> list[float | None]:
    """The probability of every record, in order, through the legacy protocol (None where it was not scored)."""
    stub = skill_pb2_grpc.SkillStub(grpc.insecure_channel(f"localhost:{port}"))
    scores: list[float | None] = []
    for batch in batches:
        answered = {r.request_id: r.probability for r in stub.Score(iter(batch), timeout=60).results
                    if r.status == skill_pb2.OK}
        scores.extend(answered.get(record.request_id) for record in batch)
    return scores


def triton_scores(grpc_url: str, batches: list) -> list[float | None]:
    """The probability of every record, in order, from `risk_pipeline` reached directly."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(grpc_url)
    scores: list[float | None] = []
    for batch in batches:
        tensor = grpcclient.InferInput(PAYLOAD, [len(batch), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([r.SerializeToString() for r in batch], dtype=object).reshape(-1, 1))
        scores.extend(float(p) for p in client.infer("risk_pipeline", [tensor], client_timeout=60)
                      .as_numpy("probability").reshape(-1))
    return scores


def compare_answers(reference: list[float | None], other: list[float | None]) -> tuple[float, int]:
    """Largest |difference| over the records both scored, and how many records `other` left unscored (or the
    reference did, which leaves nothing to compare)."""
    pairs = [(a, b) for a, b in zip(reference, other) if a is not None and b is not None]
    unanswered = len(reference) - len(pairs)
    diff = max((abs(a - b) for a, b in pairs), default=float("nan"))
    return float(diff), unanswered


@dataclass
class Side:
    """One column of the table: how its callers reach it and which process trees serve it."""
    name: str
    make_call: Callable[[], Callable[[list], None]]
    pids: list
    latency: CallLog = NO_CALLS
    throughput: CallLog = NO_CALLS
    peak_rss_bytes: int = 0
    # The largest share of the machine's CPU the other sides' processes used while this one was measured (they
    # wait, up, for their turn).
    idle_sides_cpu_share: float = 0.0

    def figures(self) -> dict:
        throughput = self.throughput.summary()
        return {"latency": asdict(self.latency.summary()), "throughput": asdict(throughput),
                "records_per_s": throughput.records_per_s,
                "calls_per_s": throughput.calls / throughput.seconds if throughput.seconds else 0.0,
                "peak_rss_bytes": self.peak_rss_bytes, "idle_sides_cpu_share": self.idle_sides_cpu_share,
                "rss_after_load_bytes": sum(process_tree.rss_bytes(pid) for pid in self.pids),
                "rss_after_load_by_process": {name: size for pid in self.pids
                                              for name, size in process_tree.rss_by_process(pid).items()}}


def _measure_in_turns(sides: list[Side], batches: list, plan: CutoverPlan, log, begin: Callable[[str], None],
                      watch: LoadWatch) -> None:
    """Every side's latency, then every side's throughput, in `plan.rounds` rounds of turns; `begin` hears each run
    as it starts (the progress of the whole plan), `watch` records the machine's load in each."""
    # First calls open connections and warm caches on every side; cold start is measured apart.
    for side in sides:
        warm = side.make_call()
        for batch in batches[:20]:
            warm(batch)
    latency_s, throughput_s = plan.latency_seconds / plan.rounds, plan.throughput_seconds / plan.rounds

    def one(turn: tuple[int, str], number: int) -> None:
        side, run = sides[turn[0]], turn[1]
        label = f"{side.name}: {run}, round {number + 1}"
        begin(label)
        if run == "latency":
            log(f"{label} (1 caller, {latency_s:g} s)")
            with watch.round(label), _IdleSides(side, sides):
                side.latency = side.latency.add(closed_loop_calls(side.make_call, batches, 1, latency_s))
            return
        log(f"{label} ({plan.callers} callers, {throughput_s:g} s)")
        with watch.round(label), _IdleSides(side, sides), process_tree.PeakRss(side.pids) as peak:
            side.throughput = side.throughput.add(closed_loop_calls(side.make_call, batches, plan.callers,
                                                                    throughput_s))
        side.peak_rss_bytes = max(side.peak_rss_bytes, peak.peak)

    # Each side's latency and throughput runs are turns of their own; the order rotates round by round.
    take_turns([(number, run) for run in ("latency", "throughput") for number in range(len(sides))], plan.rounds, one)


class _IdleSides:
    """Records on `measured` the share of the machine's CPU that the sides waiting for their turn used meanwhile
    (the process trees that serve no part of the measured side)."""

    def __init__(self, measured: Side, sides: list[Side]):
        self.measured = measured
        self.pids = sorted({pid for side in sides for pid in side.pids} - set(measured.pids))

    def __enter__(self) -> "_IdleSides":
        self._cpu, self._wall = self._used(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.monotonic() - self._wall
        share = (self._used() - self._cpu) / (wall * (psutil.cpu_count() or 1)) if wall > 0 else 0.0
        self.measured.idle_sides_cpu_share = max(self.measured.idle_sides_cpu_share, share)

    def _used(self) -> float:
        return sum(process_tree.cpu_seconds(pid) for pid in self.pids)


def _timed_start(args: list[str], ready: str) -> tuple[object, float]:
    began = time.perf_counter()
    process, _ = service_process.start(args, ready, timeout=300)
    return process, time.perf_counter() - began


def run(plan: CutoverPlan, out_dir: Path, repositories: list[Path], data_csv: Path, saved_model: Path,
        log=print, on_progress: OnProgress = no_progress) -> dict:
    """`on_progress` hears the plan's steps done, naming the one that runs."""
    data = dataset.load(data_csv)
    records = [to_protobuf({"request_id": f"b-{i}", "features": f}) for i, f in enumerate(data.records())]
    size = plan.records_per_call
    batches = [records[i:i + size] for i in range(0, len(records) - size + 1, size)]
    results = {"machine": machine(), "plan": asdict(plan),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    watch = LoadWatch(load_average_1m=results["machine"]["load_average_at_start"][0])
    begun = []

    def begin(label: str) -> None:
        on_progress(len(begun), plan.steps, label)
        begun.append(label)

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="s2t-cutover-") as tmp, ExitStack() as running:
        # Copies: `s2t serve` keeps its supervisor state in the repository's control area.
        copies = copy_repositories(repositories, Path(tmp))

        def started(label: str, args: list[str], ready: str) -> tuple[object, float]:
            begin(label)
            process, seconds = _timed_start(args, ready)
            running.callback(service_process.stop, process)
            return process, seconds

        legacy_port, grpc_port, gateway_port = free_port(), free_port(), free_port()
        grpc_url = f"localhost:{grpc_port}"
        legacy, legacy_cold = started("legacy service starting", ["legacy", "serve", "--port", str(legacy_port),
                                                                  "--saved-model", str(saved_model)], "listening")
        serve, triton_cold = started("s2t serve starting", [
            "serve", "--http-port", str(free_port()), "--grpc-port", str(grpc_port), "--metrics-port",
            str(free_port()), "--supervisor-port", "0", "--exit-timeout", "10",
            *[arg for repo in copies for arg in ("--repository", str(repo))]], "ready:")
        gateway, gateway_cold = started("gateway starting", [
            "gateway", "--port", str(gateway_port), "--grpc-url", grpc_url, "--window-size",
            str(plan.records_per_call),
            # Exactly the callers: a slot is free again before its call's answer leaves, so a caller's next call
            # is never refused.
            "--workers", str(plan.callers)], "ready")
        sides = [Side(SIDES[0], skill_caller(legacy_port), [legacy.pid]),
                 Side(SIDES[1], skill_caller(gateway_port), [serve.pid, gateway.pid]),
                 Side(SIDES[2], triton_caller(grpc_url), [serve.pid])]
        _measure_in_turns(sides, batches, plan, log, begin, watch)
        results["legacy"] = {"cold_start_s": legacy_cold, **sides[0].figures()}
        results["gateway"] = {"cold_start_s": triton_cold + gateway_cold, "serve_start_s": triton_cold,
                              "gateway_start_s": gateway_cold, **sides[1].figures()}
        results["triton"] = {"cold_start_s": triton_cold, "serve_start_s": triton_cold, **sides[2].figures()}
        legacy_scores = skill_scores(legacy_port, batches)
        gateway_scores = skill_scores(gateway_port, batches)
        direct_scores = triton_scores(grpc_url, batches)
    gateway_diff, gateway_unanswered = compare_answers(legacy_scores, gateway_scores)
    direct_diff, direct_unanswered = compare_answers(legacy_scores, direct_scores)
    results["answers"] = {"compared": len(legacy_scores), "max_abs_diff_gateway": gateway_diff,
                          "unanswered": gateway_unanswered, "max_abs_diff_triton": direct_diff,
                          "unanswered_triton": direct_unanswered}
    results["load"] = watch.summary()
    results["publishable"] = results["load"]["publishable"]
    results["acceptance"] = cutover_acceptance.summary(results)
    report.write_files(out_dir, results, table(results))
    on_progress(len(begun), plan.steps, f"results in {out_dir}")
    return results


def _idle_share(results: dict) -> float:
    return max(results[side].get("idle_sides_cpu_share", 0.0) for side in ("legacy", "gateway", "triton"))


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
        *machine_load.markdown_lines(results["load"]),
        f"Calls of {plan['records_per_call']} German Credit records; latency with 1 caller, throughput with "
        f"{plan['callers']} callers in a closed loop; the three sides up at once and measured in turns, "
        f"{plan.get('rounds', 1)} rounds each, figures over all rounds (the waiting sides used at most "
        f"{_idle_share(results):.1%} of the CPU during another's run); machine: "
        f"{results['machine']['logical_cores']} cores, "
        f"{results['machine']['os']}, load generator on the same cores; run {results['started']}. Cold start: the "
        "command's launch until it answers (`s2t serve` to every model ready, then the gateway to its ready line).",
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
        row("RSS of the process tree after load, MB", lambda s: f"{s['rss_after_load_bytes'] / MB:,.0f}"),
        "",
        f"Answers against the legacy service's, record by record ({results['answers']['compared']} records): "
        f"gateway path max |diff| {results['answers']['max_abs_diff_gateway']:.2e} "
        f"({results['answers']['unanswered']} unanswered), Triton directly max |diff| "
        f"{results['answers']['max_abs_diff_triton']:.2e} ({results['answers']['unanswered_triton']} unanswered).",
        "",
        *cutover_acceptance.markdown_lines(results["acceptance"]),
    ]
    return "\n".join(lines)
