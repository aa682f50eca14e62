"""`s2t bench`: every measurement of one run, on one machine, against one copy of the repositories
(harness/repository.py says why copies)."""
from __future__ import annotations

import json
import secrets
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np

from s2t.backends.records.feature_spec import FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder
from s2t import triton_config
from s2t.bench.load import h2load, open_loop, perf_analyzer, wrk
from s2t.bench.baselines import ceiling, limit_baseline as inprocess
from s2t.bench.harness import process_tree, report, workload
from s2t.bench.harness.repository import copy_repositories
from s2t.bench.scenarios import protocols, rollback_under_load, stub_profile
from s2t.bench.baselines.fastapi_baseline import APPS as BASELINE_APPS, ROUTE as BASELINE_ROUTE, BaselineServer
from s2t.bench.harness.machine_load import LoadWatch, machine
from s2t.bench.harness.modes import Mode
from s2t.bench.harness.rounds import median, median_round, take_turns
from s2t.on_progress import OnProgress, no_progress
from s2t.serve import service_process
from s2t.serve.foreground import triton_server
from s2t.serve.serve_options import ServeOptions
from s2t.serve.triton_server import TritonServer, free_port
from s2t.triton_admin import TritonAdmin
from s2t.control.version_store import version_numbers
from s2t.wire.names import ADAPTER, DECISION, DECISION_MODEL, PAYLOAD, PIPELINE, PROBABILITY, SCORER

TRITON_ROUTE = f"/v2/models/{PIPELINE}/infer"
# The ceiling's wrk rounds (baselines/ceiling.py), beside Triton's and the FastAPI apps' but never an opponent.
CEILING_SIDE = "ceiling"
CHECKED_RECORDS = 50
# The open-loop generator's pool: more connections than requests in flight at 80% of the baseline's capacity, so
# that a request waits for a connection only when a side falls behind (and that wait is in its latency).
OPEN_LOOP_CONNECTIONS = 64
# py-spy needs a moment to attach before it samples: a shorter profile may hold no sample at all.
PROFILE_MIN_SECONDS = 2


def _model_dir(repositories: list[Path], model: str) -> Path:
    for repo in repositories:
        if (repo / model / "config.pbtxt").is_file():
            return repo / model
    raise FileNotFoundError(f"no repository holds {model}")


def _newest_onnx(model_dir: Path) -> Path:
    versions = version_numbers(model_dir)
    if not versions:
        raise FileNotFoundError(f"{model_dir} has no version; run `make models`")
    return model_dir / str(versions[-1]) / "model.onnx"


def _stats(http_url: str, model: str) -> tuple[int, int]:
    """(requests, rows) Triton answered successfully for `model`, all versions."""
    stats = TritonAdmin(http_url).model_stats(model)
    return (sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
            sum(int(s.get("inference_count", 0)) for s in stats))


class Bench:
    def __init__(self, mode: Mode, out_dir: Path, repositories: list[Path], data_csv: Path,
                 log: Callable[[str], None] = print, on_progress: OnProgress = no_progress,
                 protocol_clients: str = "low-cpu"):
        """`on_progress` hears the steps done out of the run's total (`steps()`), naming the one that runs;
        `protocol_clients` picks the load generators of the HTTP / gRPC comparison (protocols.GENERATORS)."""
        if protocol_clients not in protocols.GENERATORS:
            raise ValueError(f"protocol_clients: one of {', '.join(protocols.GENERATORS)}, got {protocol_clients!r}")
        self.mode, self.out_dir, self.data_csv, self.log = mode, Path(out_dir), Path(data_csv), log
        self.protocol_clients = protocol_clients
        self.on_progress, self.steps_done = on_progress, 0
        self.source_repositories = [Path(r) for r in repositories]
        self.results: dict = {"mode": mode.name, "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                                  time.gmtime())}
        self.load = LoadWatch(load_average_1m=self.results["machine"]["load_average_at_start"][0])

    def steps(self) -> int:
        """Each server start, perf_analyzer point and protocol round, the FastAPI apps' start, each wrk round of
        each side, the profile, the hot swap, the stream replay and the in-process measures."""
        mode = self.mode
        return (mode.cold_starts + 1 + len(perf_plan(self.mode)) + len(protocols.PROTOCOLS) * mode.protocol_rounds + 1
                + mode.http_rounds * (2 + len(baseline_sides(mode))) + 4
                + mode.open_loop_rounds * 2 * len(mode.open_loop_shares))

    @contextmanager
    def _step(self, label: str):
        self.on_progress(self.steps_done, self.steps(), label)
        yield
        self.steps_done += 1

    def _steps_of(self, first: int) -> OnProgress:
        """A callback for a stage that counts its own steps, placed after the `first` ones of the run."""
        return lambda done, total, label: self.on_progress(first + done, self.steps(), label)

    def run(self) -> dict:
        started = time.monotonic()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="s2t-bench-") as tmp:
            self.tmp = Path(tmp)
            self.repositories = copy_repositories(self.source_repositories, self.tmp / "repositories")
            self._prepare_inputs()
            self._triton_stages()
            self._inprocess_stage()
        self.results["seconds"] = time.monotonic() - started
        self.results["load"] = self.load.summary()
        self.results["publishable"] = self.results["load"]["publishable"]
        report.write(self.results, self.out_dir)
        self.on_progress(self.steps_done, self.steps(), f"results in {self.out_dir}")
        return self.results

    def _prepare_inputs(self) -> None:
        self.workload = workload.Workload.load(self.data_csv)
        self.payloads = self.workload.payloads()
        adapter = _model_dir(self.repositories, ADAPTER)
        self.spec_path = adapter / "1" / "feature_spec.json"
        self.decoder = RecordDecoder(FeatureSpec.from_file(self.spec_path))
        self.categorical, self.numeric = workload.pack(self.decoder, self.payloads)
        self.scorer_onnx = _newest_onnx(_model_dir(self.repositories, SCORER))
        self.decision_dir = _model_dir(self.repositories, DECISION_MODEL)
        self.inputs = {PIPELINE: self.tmp / "pipeline.json", SCORER: self.tmp / "scorer.json"}
        self.inputs[PIPELINE].write_text(json.dumps(workload.perf_input_pipeline(self.payloads)))
        self.inputs[SCORER].write_text(json.dumps(workload.perf_input_scorer(self.categorical, self.numeric)))
        bodies = [workload.triton_json_body(p) for p in self.payloads]
        # The HTTP / gRPC comparison's wrk sends the one record h2load sends (load/generators.py).
        self.one_record_script = wrk.write_script(self.tmp / "triton_one_record.lua", TRITON_ROUTE, bodies[:1])
        self.triton_script = wrk.write_script(self.tmp / "triton.lua", TRITON_ROUTE, bodies)
        self.ceiling_script = wrk.write_script(self.tmp / "ceiling.lua", f"/v2/models/{ceiling.CEILING}/infer", bodies)
        self.baseline_script = wrk.write_script(self.tmp / "baseline.lua", BASELINE_ROUTE,
                                                [p.decode() for p in self.payloads])
        self.open_loop_bodies = {"triton": open_loop.write_bodies(self.tmp / "triton_bodies.json", bodies),
                                 "baseline": open_loop.write_bodies(self.tmp / "baseline_bodies.json",
                                                                    [p.decode() for p in self.payloads])}

    def _server(self, log_name: str = "tritonserver.log", admin_key: str | None = None, **options) -> TritonServer:
        """tritonserver as `s2t serve` runs it, with its default options but `options` (on the run's copies and free
        ports)."""
        served = ServeOptions(repositories=tuple(self.repositories), http_port=free_port(), grpc_port=free_port(),
                              metrics_port=free_port(), exit_timeout_s=10, **options)
        return triton_server(served, admin_key=admin_key, log_path=self.tmp / log_name, stop_gracefully=False)

    def _serve_command(self) -> tuple[list[str], str]:
        """`s2t serve` as a user runs it, on the run's copies and free ports; and its HTTP address."""
        http_port = free_port()
        args = ["serve", "--http-port", str(http_port), "--grpc-port", str(free_port()),
                "--metrics-port", str(free_port()), "--supervisor-port", "0", "--exit-timeout", "10",
                *[arg for repo in self.repositories for arg in ("--repository", str(repo))]]
        return args, f"localhost:{http_port}"

    def _cold_start(self) -> TritonServer:
        """The clock a user sees: `s2t serve`'s launch until it says every model is ready (strict readiness), on
        fresh starts. The last one also takes a short load, then the RSS of its whole serving tree (s2t serve,
        tritonserver, the stubs) is read. The measured stages then run on a tritonserver started directly; its
        own start (the server's clock, without the command around it) is recorded beside."""
        seconds = []
        for attempt in range(self.mode.cold_starts):
            args, http_url = self._serve_command()
            with self._step(f"cold start {attempt + 1}/{self.mode.cold_starts}"):
                began = time.monotonic()
                serve, _ = service_process.start(args, "ready:", timeout=300)
                try:
                    seconds.append(time.monotonic() - began)
                    if attempt == self.mode.cold_starts - 1:
                        models = _ready_models(http_url)
                        wrk.run(f"http://{http_url}", self.triton_script, self.mode.http_connections, 2)
                        tree = process_tree.rss_by_process(serve.pid)
                finally:
                    service_process.stop(serve)
        self.results["cold_start"] = {"seconds": seconds, "first_s": seconds[0],
                                      "median_s": median(seconds, higher_is_better=False), "models": models,
                                      "clock": "s2t serve's launch to every model ready"}
        self.results["serving_tree"] = {"after_load_bytes": sum(tree.values()), "after_load_by_process": tree}
        self.log(f"cold start {self.results['cold_start']['median_s']:.2f} s from s2t serve's launch, first "
                 f"{seconds[0]:.2f} s, worst {max(seconds):.2f} s ({len(seconds)} starts), "
                 f"serving tree {sum(tree.values()) / 2**20:.0f} MB after load")
        # The ceiling is served by the measured stages' server only: the cold starts load what users serve.
        ceiling.add(_model_dir(self.repositories, PIPELINE).parent)
        server = self._server()
        with self._step("tritonserver for the measured stages starting"):
            began = time.monotonic()
            server.start()
            self.results["cold_start"]["tritonserver_start_s"] = time.monotonic() - began
        return server

    def _triton_stages(self) -> None:
        server = self._cold_start()
        try:
            pid = server.process.pid
            time.sleep(1.0)
            idle = process_tree.rss_by_process(pid)
            self.results["memory"] = {"triton_idle_bytes": sum(idle.values()), "triton_idle_by_process": idle}
            peak = process_tree.PeakRss([pid]).start()
            self.results["perf_analyzer"], self.results["perf_analyzer_failures"] = self._perf_points(server)
            grpc_body = self.tmp / "grpc_body.bin"
            grpc_body.write_bytes(h2load.infer_body(PIPELINE, PAYLOAD, self.payloads[0]))
            load = protocols.Load(self.inputs[PIPELINE], self._perf_settings(),
                                  self.one_record_script, grpc_body, self.mode.http_seconds)
            self.results["protocols"] = protocols.compare(
                pid, {"http": server.http_url, "grpc": server.grpc_url}, PIPELINE, load,
                self.mode.http_connections, self.mode.protocol_rounds, lambda: _stats(server.http_url, PIPELINE)[0],
                self.log, self._steps_of(self.steps_done), self.load.round, clients=self.protocol_clients,
                front_pid=server.front.pid if server.front is not None else None)
            self.steps_done += len(protocols.PROTOCOLS) * self.mode.protocol_rounds
            self._side_by_side(server)
            self.results["memory"]["triton_peak_bytes"] = peak.stop()
            after_load = process_tree.rss_by_process(pid)
            self.results["memory"]["triton_after_load_bytes"] = sum(after_load.values())
            self.results["memory"]["triton_after_load_by_process"] = after_load
            with self._step("stream replay"):
                self.results["streaming"] = self._streaming(server)
        finally:
            server.stop()
        with self._step("rollback under load"):
            self.results["hot_swap"] = self._hot_swap()

    def _side_by_side(self, server: TritonServer) -> None:
        """wrk on Triton and on every FastAPI side (each app at each worker count of the mode), taking turns with
        the order rotating, all of them up: the same machine, the same moments. Each round's strongest FastAPI side
        is that round's baseline (rounds.duel), as Triton's settings are its best."""
        baselines = {}
        try:
            with self._step("FastAPI apps starting"):
                for name, (app, workers) in baseline_sides(self.mode).items():
                    baselines[name] = BaselineServer(self.scorer_onnx, _model_dir(self.repositories, PIPELINE),
                                                     free_port(), app=app, workers=workers,
                                                     log_path=self.tmp / f"{app}-{workers}.log").start()
                self.results["same_answers"] = {name: _compare_answers(server, b, self.payloads[:CHECKED_RECORDS])
                                                for name, b in baselines.items()}
            sides = {"triton": (server.process.pid, "http://" + server.http_url, self.triton_script)}
            sides.update({name: (b.process.pid, b.url, self.baseline_script) for name, b in baselines.items()})
            sides[CEILING_SIDE] = (server.process.pid, "http://" + server.http_url, self.ceiling_script)
            ceiling_before = stub_profile.snapshot(server.http_url, ceiling.CEILING)

            def one(side: str, number: int) -> dict:
                pid, url, script = sides[side]
                label = f"{side} round {number + 1}"
                with self._step(f"wrk {label}"):
                    return self._wrk(pid, url, script, self.mode.http_seconds, label)

            rounds = take_turns(list(sides), self.mode.http_rounds, one)
            self.results["ceiling"] = _ceiling_result(rounds.pop(CEILING_SIDE), rounds["triton"], stub_profile.breakdown(
                ceiling_before, stub_profile.snapshot(server.http_url, ceiling.CEILING)))
            medians = {side: _median_round(entries) for side, entries in rounds.items()}
            strongest = max(baselines, key=lambda name: medians[name]["throughput"])
            self.results["http_rounds"] = rounds
            self.results["http_fastapi_apps"] = {name: medians[name] for name in baselines}
            self.results["http_triton"] = medians["triton"]
            self.results["http_baseline"] = {**medians[strongest], "app": strongest}
            self.results["open_loop"] = self._open_loop(server, baselines, medians)
            with self._step("profile of risk_pipeline under wrk"):
                self.results["where_time_goes"] = self._profile(server)
            self.results["memory"]["baseline_after_load_bytes"] = process_tree.rss_bytes(baselines[strongest].process.pid)
            self.results["baseline_start_s"] = baselines[strongest].startup_seconds
        finally:
            for baseline in baselines.values():
                baseline.stop()

    def _open_loop(self, server: TritonServer, baselines: dict[str, BaselineServer], medians: dict[str, dict]) -> dict:
        """Latency at the same offered rate: Triton and the plain FastAPI app at its strongest worker count (its
        capacity: its median wrk round), each fed the same schedule at each share of that capacity, taking turns
        with the order rotating. Latency runs from each request's scheduled time (load/open_loop.py)."""
        plain = [name for name, (app, _) in baseline_sides(self.mode).items() if app == "baseline"]
        opponent = max(plain, key=lambda name: medians[name]["throughput"])
        capacity = medians[opponent]["throughput"]
        targets = {"triton": ("http://" + server.http_url, TRITON_ROUTE, self.open_loop_bodies["triton"]),
                   opponent: (baselines[opponent].url, BASELINE_ROUTE, self.open_loop_bodies["baseline"])}
        turns = [(side, share) for share in self.mode.open_loop_shares for side in targets]

        def one(turn: tuple[str, float], number: int) -> dict:
            side, share = turn
            url, route, bodies = targets[side]
            label = f"open-loop {side} at {share:.0%} round {number + 1}"
            with self._step(label), self.load.round(label):
                found, reasons = open_loop.run(url, route, bodies, share * capacity, self.mode.open_loop_seconds,
                                               OPEN_LOOP_CONNECTIONS,
                                               warmup_s=min(1.0, self.mode.open_loop_seconds / 2))
            self.log(f"{label} ({found.offered_rate:.0f} req/s offered): {found.achieved_rate:.0f} req/s, p50 "
                     f"{found.p50_ms:.2f} ms, p99 {found.p99_ms:.2f} ms, errors {found.errors}, unanswered "
                     f"{found.unanswered}" + ("" if found.kept_up else ", did NOT keep up")
                     + (f" ({'; '.join(reasons)})" if reasons else ""))
            return found.as_dict()

        taken = take_turns(turns, self.mode.open_loop_rounds, one)
        points = []
        for share in self.mode.open_loop_shares:
            rounds = {side: taken[(side, share)] for side in targets}
            points.append({"share": share, "offered_rate": share * capacity, "rounds": rounds,
                           "median": {side: median_round(entries, "p99_ms", higher_is_better=False)
                                      for side, entries in rounds.items()}})
        return {"opponent": opponent, "capacity_rps": capacity, "connections": OPEN_LOOP_CONNECTIONS,
                "seconds": self.mode.open_loop_seconds, "points": points,
                "generator": "s2t.bench.load.open_loop (asyncio, keep-alive HTTP/1.1, latency from the scheduled "
                             "send time)"}

    def _perf_settings(self) -> perf_analyzer.Settings:
        return perf_analyzer.Settings(self.mode.window_requests, window_ms=self.mode.perf_window_ms)

    def _perf_points(self, server: TritonServer) -> tuple[list[dict], list[dict]]:
        """The measured points, and the points perf_analyzer gave up on (a request refused by the queue timeout
        ends its run), with its last words: a failed point is a result, not a reason to lose the others."""
        settings = self._perf_settings()
        points, failures = [], []
        for model, protocol, batch, concurrency, rate in perf_plan(self.mode):
            url = server.http_url if protocol == "http" else server.grpc_url
            load = f"c={concurrency}" if concurrency else f"rate={rate:g}/s"
            with self._step(f"perf_analyzer {model} {protocol} b={batch} {load}"):
                before = _stats(server.http_url, model)
                try:
                    with self.load.round(f"perf_analyzer {model} {protocol} b={batch} {load}"), \
                            process_tree.CpuSplit(server.process.pid) as cpu:
                        point = perf_analyzer.measure(url, protocol, model, self.inputs[model], settings, batch=batch,
                                                      concurrency=concurrency, request_rate=rate)
                except RuntimeError as err:
                    reason = " / ".join(str(err).strip().splitlines()[-2:])
                    failures.append({"model": model, "protocol": protocol, "batch": batch,
                                     "concurrency": concurrency, "request_rate": rate, "error": reason})
                    self.log(f"perf_analyzer {model} {protocol} b={batch} {load}: FAILED: {reason}")
                    continue
                requests = _stats(server.http_url, model)[0] - before[0]
                entry = {**point.as_dict(), "cpu_ms_per_request": 1000 * cpu.server_seconds / max(requests, 1),
                         # perf_analyzer's own CPU: on shared cores it is taken from the server.
                         "client_cpu_ms_per_request": 1000 * cpu.delta["client"] / max(requests, 1),
                         "cpu_cores": cpu.server_seconds / max(cpu.wall_seconds, 1e-9)}
                points.append(entry)
                self.log(f"perf_analyzer {model} {protocol} b={batch} {load}: {point.infer_per_s:.0f} rows/s, "
                         f"p50 {point.p50_ms:.2f} ms, p99 {point.p99_ms:.2f} ms")
        return points, failures

    def _wrk(self, pid: int, url: str, script: Path, seconds: float, label: str) -> dict:
        wrk.run(url, script, self.mode.http_connections, 1)  # warm-up: connections, caches, lazy imports
        with self.load.round(f"wrk {label}"), process_tree.CpuSplit(pid) as cpu:
            result = wrk.run(url, script, self.mode.http_connections, seconds)
        entry = {**result.as_dict(), "connections": self.mode.http_connections,
                 "cpu_ms_per_request": 1000 * cpu.server_seconds / max(result.answered, 1),
                 "client_cpu_ms_per_request": 1000 * cpu.delta["client"] / max(result.answered, 1),
                 "cpu_cores": cpu.server_seconds / max(cpu.wall_seconds, 1e-9), "rss_bytes": process_tree.rss_bytes(pid)}
        self.log(f"wrk {label} c={self.mode.http_connections}: {result.throughput:.0f} req/s, p50 {result.p50_ms:.2f} ms,"
                 f" p99 {result.p99_ms:.2f} ms, errors {result.errors}, CPU {entry['cpu_ms_per_request']:.3f} ms/req")
        return entry

    def _profile(self, server: TritonServer) -> dict:
        """One more wrk run on risk_pipeline, outside the measured rounds: Triton's statistics over it, and py-spy
        on the interpreter running its model.py (sampling slows it a little, so its run's rate is not a result)."""
        seconds = max(self.mode.http_seconds, PROFILE_MIN_SECONDS)
        before = stub_profile.snapshot(server.http_url, PIPELINE)
        out = self.tmp / "py-spy.txt"
        try:
            spy = stub_profile.start(stub_profile.python_pid(server.process.pid, server.http_url, PIPELINE),
                                     seconds, out)
        except RuntimeError as err:
            spy = None
            self.log(f"py-spy: {err}")
        wrk.run("http://" + server.http_url, self.triton_script, self.mode.http_connections, seconds)
        statistics = stub_profile.breakdown(before, stub_profile.snapshot(server.http_url, PIPELINE))
        profile = {}
        if spy is not None:
            _, errors = spy.communicate(timeout=seconds + 30)
            profile = stub_profile.summarize(out.read_text()) if out.is_file() else {"error": errors.strip()[-500:]}
        self.log(f"risk_pipeline under wrk: mean batch {statistics['mean_batch']:.1f}, per execution "
                 + ", ".join(f"{k} {v:.0f} us" for k, v in statistics["per_execution_us"].items()))
        return {"triton_statistics": statistics, "py_spy": profile}

    def _hot_swap(self) -> dict:
        """`s2t rollback` under gRPC load on a server of its own, in explicit mode with the admin key, the measured
        stages' server stopped (rollback_under_load.py)."""
        key = secrets.token_urlsafe(32)
        server = self._server("rollback.log", admin_key=key, model_control_mode="explicit")
        repo = _model_dir(self.repositories, SCORER).parent
        with server:
            return rollback_under_load.run(server.http_url, server.grpc_url, key, repo,
                                           tuple(r for r in self.repositories if r != repo), self.scorer_onnx,
                                           self.payloads, self.mode.swaps, self.tmp, self.log)

    def _streaming(self, server: TritonServer) -> dict:
        from s2t.clients import stream_client
        records = [{"features": r["features"]} for r in self.workload.records]
        replayed = [records[i % len(records)] for i in range(self.mode.stream_records)]
        results, _, seconds = stream_client.replay(server.grpc_url, replayed, self.mode.stream_streams,
                                                   shuffle=0.1, window=8)
        summary = stream_client.summarize(results, seconds)
        self.log(f"stream: {summary.throughput:.0f} records/s on {summary.streams} streams, "
                 f"in-order {summary.in_order_rate:.3f}")
        return {"streams": summary.streams, "records": summary.sent, "seconds": summary.seconds,
                "throughput": summary.throughput, "ok": summary.ok, "errors": summary.errors,
                "in_order_rate": summary.in_order_rate, "exactly_once": summary.exactly_once,
                "latency_ms": dict(summary.latency_ms)}

    def _inprocess_stage(self) -> None:
        batches = sorted(set(self.mode.batches) | {1})
        thresholds = triton_config.decision_thresholds(self.decision_dir)
        with self._step("in-process ONNX Runtime"):
            points = inprocess.measure(self.scorer_onnx, self.categorical, self.numeric, self.payloads, self.decoder,
                                       thresholds, batches, self.mode.inprocess_seconds)
        self.results["inprocess"] = [p.as_dict() for p in points]
        for p in points:
            self.log(f"in-process {p.what} b={p.batch}: {p.rows_per_s:.0f} rows/s")


def _median_round(entries: list[dict]) -> dict:
    """The round of median throughput, whole (rounds.median_round), and every round's rate; every round, whole, is
    in `http_rounds`."""
    return {**median_round(entries, "throughput"), "rounds_throughput": [e["throughput"] for e in entries]}


def baseline_sides(mode: Mode) -> dict[str, tuple[str, int]]:
    """The FastAPI sides of the mode: each app at each worker count, by name (the app's alone at a single count)."""
    return {(app if len(mode.baseline_workers) == 1 else f"{app} ({workers} worker{'s' * (workers > 1)})"):
            (app, workers)
            for app in BASELINE_APPS for workers in mode.baseline_workers}


def _ready_models(http_url: str) -> list[str]:
    return sorted(f"{m['name']}:{m.get('version', '')}" for m in TritonAdmin(http_url).repository_index()
                  if m.get("state") == "READY")


def perf_plan(mode: Mode) -> list[tuple[str, str, int, int | None, int | None]]:
    """(model, protocol, batch, concurrency, request rate) of every perf_analyzer point."""
    plan = [(m, p, 1, c, None) for m in (PIPELINE, SCORER) for p in ("http", "grpc") for c in mode.concurrency]
    plan += [(m, "grpc", b, 2, None) for m in (SCORER, PIPELINE) for b in mode.batches if b > 1]
    plan += [(PIPELINE, p, 1, None, r) for p in mode.rate_protocols for r in mode.request_rates]
    return plan


def _ceiling_result(rounds: list[dict], triton: list[dict], statistics: dict) -> dict:
    """risk_pipeline's req/s over the ceiling's, round by round (each pair measured in the same round)."""
    share = [t["throughput"] / c["throughput"] if c["throughput"] else float("nan") for t, c in zip(triton, rounds)]
    return {"model": ceiling.CEILING, "rounds": rounds, "share": share, "triton_statistics": statistics}


def _compare_answers(server: TritonServer, baseline: BaselineServer, payloads: list[bytes]) -> dict:
    """The baseline must do the same work: same probability and decision as risk_pipeline on real records."""
    import tritonclient.http as http
    client = http.InferenceServerClient(server.http_url)
    try:
        inp = http.InferInput(PAYLOAD, [len(payloads), 1], "BYTES")
        inp.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object))
        result = client.infer(PIPELINE, [inp])
        triton_p = result.as_numpy(PROBABILITY).ravel()
        triton_d = [d.decode() for d in result.as_numpy(DECISION).ravel()]
    finally:
        client.close()
    base_p, base_d = [], []
    for p in payloads:
        req = urllib.request.Request(baseline.url + BASELINE_ROUTE, data=p, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.load(resp)
        base_p.append(answer["probability"])
        base_d.append(answer["decision"])
    return {"records": len(payloads), "max_abs_diff": float(np.max(np.abs(triton_p - np.array(base_p)))),
            "same_decisions": triton_d == base_d}

