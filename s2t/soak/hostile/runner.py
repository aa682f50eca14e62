"""`s2t soak --hostile`: valid traffic on every path while hostile clients try to starve, exhaust or reach past
the service, in three phases (before, during and after the floods), on `s2t serve --llm` and `s2t gateway` started
on free ports.

Valid paths (valid_paths.py), each paced at its own rate with a cap of requests in flight: risk_pipeline over HTTP
and gRPC, risk_stream (a short stream per request), the legacy gateway's Score, and llm's generate_stream (latency:
time to the first token). The floods (patterns.py) all start when `during` starts and let go of what they hold when
it ends. The report says, per guarantee, whether it held (see report.py), from what was measured here: nothing is
assumed fixed.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from s2t.soak.hostile import report as soak_report
from s2t.soak.hostile.patterns import CALLER_ERROR_FLOODS, FLOOD_NAMES, FLOOD_SIZES, WIRE_ATTACK_FLOODS, \
    run_floods
from s2t.soak.hostile.report import ANSWERED, phase_bounds
from s2t.soak.hostile.valid_paths import LATENCY_TARGETS_MS, VALID_TIMEOUT_S, Calls, Clock, ValidPath, guarded, \
    host_port, path_calls
from s2t.soak.hostile.watch import Watch, leftovers, listening_pids, port_owner, run_processes, serving_pids, \
    shm_entries, supervisor_counts
from s2t.on_progress import OnProgress, no_progress
from s2t.soak import rss_trend
from s2t.serve import service_process
from s2t.serve.triton_server import free_port


@dataclass
class Options:
    seconds: float
    rate: float
    floods: str = "full"
    latency_targets_ms: Mapping[str, float] | None = None
    # Seconds between RSS samples (None: every 2 s, finer in a run under four minutes, so that the half of its
    # first phase that is fitted still has points to fit).
    sample_every_s: float | None = None
    # Floods left out (patterns.FLOOD_NAMES): the verdicts they decide are then not measured.
    skip_floods: frozenset[str] = frozenset()

    def __post_init__(self):
        unknown = sorted(set(self.skip_floods) - set(FLOOD_NAMES))
        if unknown:
            raise ValueError(f"no flood named {', '.join(unknown)}; the floods are {', '.join(FLOOD_NAMES)}")


@dataclass
class Services:
    """Where the soak sends its traffic ("http", "grpc", "metrics", "gateway": HOST:PORT) and the roots of the two
    process trees it watches: `s2t serve` (or tritonserver itself) and the gateway; None where not found."""
    urls: Mapping[str, str]
    serving_pid: int | None
    gateway_pid: int | None
    started: bool
    exit_codes: dict[str, int | str] = field(default_factory=dict)


@contextmanager
def started_services(on_progress: OnProgress, planned: int, log_base: Path | None = None) -> Iterator[Services]:
    """`s2t serve --llm` and `s2t gateway` on free ports, stopped with SIGTERM at the end (exit codes recorded);
    their output in `log_base` with suffixes .serve.log and .gateway.log when given."""
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "gateway", "supervisor")}
    urls = {name: f"localhost:{port}" for name, port in ports.items()}
    on_progress(0, planned, "starting s2t serve --llm and s2t gateway")
    serve, _ = service_process.start(["serve", "--llm", "--http-port", str(ports["http"]), "--grpc-port",
                                      str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
                                      "--supervisor-port", str(ports["supervisor"]), "--exit-timeout", "10",
                                      # the soak does not use /v1: no OpenAI API, so no fixed port 9000
                                      "--openai-port", "0"],
                                     "ready:", timeout=300,
                                     log=log_base.with_suffix(".serve.log") if log_base else None)
    gateway = None
    services = Services(urls, serve.pid, None, started=True)
    try:
        gateway, _ = service_process.start(["gateway", "--port", str(ports["gateway"]), "--grpc-url", urls["grpc"]],
                                           "ready:", timeout=120,
                                           log=log_base.with_suffix(".gateway.log") if log_base else None)
        services.gateway_pid = gateway.pid
        yield services
    finally:
        on_progress(planned, planned, "stopping the services")
        if gateway is not None:
            services.exit_codes["gateway"] = _stop(gateway)
        services.exit_codes["serve"] = _stop(serve)


def running_services(urls: Mapping[str, str]) -> Services:
    """Services started by someone else: their processes found by the ports they listen on (when this user can
    see them), never stopped here."""
    listening = listening_pids()
    server = listening.get(host_port(urls["http"])[1])
    if server is not None:
        parent = psutil.Process(server).parent()
        # `s2t serve` keeps tritonserver as its child: watch the whole tree, its supervisor included.
        if parent is not None and "serve" in parent.cmdline():
            server = parent.pid
    return Services(dict(urls), server, listening.get(host_port(urls["gateway"])[1]), started=False)


def run(options: Options, records: Sequence[Mapping], on_progress: OnProgress = no_progress,
        urls: Mapping[str, str] | None = None, log_base: Path | None = None) -> dict:
    """Soak the services at `urls` ("http", "grpc", "metrics", "gateway", and optionally "supervisor"), or start
    them (and stop them) when None (their output then next to `log_base`); the report as a dict (JSON-ready)."""
    planned = int(options.seconds)
    load_start = os.getloadavg()
    shm_before, processes_before = shm_entries(), run_processes()
    if urls is None:
        with started_services(on_progress, planned, log_base) as services:
            measured = _soak(options, records, services, on_progress)
    else:
        services = running_services(urls)
        measured = _soak(options, records, services, on_progress)
    watch, flood_results = measured.watch, measured.floods
    left, regions_left = leftovers(watch) if services.started else ([], [])
    shm_after = shm_entries()
    targets = {**LATENCY_TARGETS_MS, **(options.latency_targets_ms or {})}
    paths_summary = {path.path: soak_report.path_summary(path.samples) for path in measured.paths}
    bogus = flood_results.get("bogus_routes", {})
    bounds = phase_bounds(watch.clock.phases_s)
    report = {
        "seconds": options.seconds, "rate": options.rate, "floods_size": options.floods,
        "flood_sizes": asdict(FLOOD_SIZES[options.floods]), "skipped_floods": sorted(options.skip_floods),
        "phases_s": watch.clock.phases_s,
        "services": {"urls": dict(services.urls), "started_by_the_soak": services.started,
                     "serving_pid": services.serving_pid, "gateway_pid": services.gateway_pid,
                     "grpc_port_served_by": measured.grpc_port_served_by},
        "latency_targets_ms": targets, "paths": paths_summary, "floods": flood_results,
        "warm_up_failures": {name: [f"{o[0]}: {o[2]}"[:200] for o in out]
                             for name, out in measured.warm_up.items() if out},
        "rss": {group: {p: phases[p] for p in soak_report.PHASES if p in phases}
                for group, phases in watch.rss.items()},
        # The rule: the service's memory (the serving tree and the gateway, as the plain soak judges its tree),
        # 72 hours more of each load (rss_trend): the valid load before and after the floods one line through both
        # stretches, the floods their own; what a load takes when it starts is a step between them, and growth
        # that goes on under either fails it.
        "rss_trend_by_load": rss_trend.load_trends({"service": rss_trend.summed(watch.series)}, bounds,
                                                   soak_report.LOADS),
        # Information beside the rule: each group's and each process's lines, by load and by phase, and the whole
        # run's (a step between phases reads as growth there).
        "rss_trend_by_group_and_load": rss_trend.load_trends(watch.series, bounds, soak_report.LOADS),
        "rss_trend_by_phase": rss_trend.phase_trends(watch.series, bounds),
        "rss_trend": rss_trend.trends(watch.series, options.seconds),
        "rss_trend_by_process": rss_trend.trends(watch.process_series, options.seconds),
        "rss_trend_by_process_and_load": rss_trend.load_trends(watch.process_series, bounds, soak_report.LOADS),
        "rss_samples": {group: points for group, points in watch.series.items()},
        "load_average": {"start": [round(v, 2) for v in load_start],
                         "end": [round(v, 2) for v in os.getloadavg()], "cpus": os.cpu_count()},
        "pids": {"before": measured.pids_before, "after": measured.pids_after},
        "supervisor_before": measured.supervisor_before, "supervisor": measured.supervisor_after,
        "exit_codes": services.exit_codes,
        "shm": {"before": len(shm_before), "after": len(shm_after),
                "new": sorted(set(shm_after) - set(shm_before)), "gone": sorted(set(shm_before) - set(shm_after)),
                "regions_of_the_run": sorted(watch.regions), "regions_left": regions_left},
        "processes": {"before": processes_before, "after": run_processes(),
                      "seen": len(watch.seen), "left": left},
    }
    not_stopped = soak_report.not_measured("the services were not started, so not stopped, by this run")
    valid_succeeded = soak_report.valid_requests_succeeded(paths_summary)
    report["verdicts"] = {
        "every_request_answered": soak_report.every_request_answered(paths_summary, flood_results),
        "valid_requests_succeeded": valid_succeeded,
        "latency_targets_kept": soak_report.latency_targets_kept(paths_summary, targets),
        "no_process_restarts": soak_report.no_restarts(measured.pids_before, measured.pids_after),
        "no_reload_or_restart_for_caller_errors": soak_report.no_reload_or_restart(
            soak_report.supervisor_totals(measured.supervisor_before),
            soak_report.supervisor_totals(measured.supervisor_after)),
        "caller_errors_answered_alone": soak_report.caller_errors_answered_alone(
            {name: flood_results.get(name, {}) for name in CALLER_ERROR_FLOODS}, valid_succeeded),
        "rss_projection": rss_trend.verdict(report["rss_trend_by_load"]),
        "metric_labels_from_configuration": soak_report.labels_from_configuration(bogus.get("leaked_labels", 0),
                                                                                  bogus.get("sent", 0)),
        "admin_apis_restricted": soak_report.apis_restricted(flood_results["api_probes"]["probes"]),
        "oversized_bodies_refused": soak_report.oversized_bodies_refused(flood_results.get("oversized_bodies")),
        **{f"{name}_answered_alone": soak_report.flood_answered_alone(flood_results.get(name), holds_when)
           for name, holds_when in WIRE_ATTACK_FLOODS.items()},
        "no_shm_region_left": soak_report.nothing_left("shared-memory regions", regions_left)
        if services.started else not_stopped,
        "no_process_left": soak_report.nothing_left("processes", left + report["processes"]["after"])
        if services.started else not_stopped,
    }
    return report


@dataclass
class Measured:
    """What the soak saw of the services while it ran."""
    watch: Watch
    paths: list[ValidPath]
    floods: dict
    warm_up: dict[str, list]
    pids_before: dict[str, int]
    pids_after: dict[str, int]
    supervisor_before: list[str]
    supervisor_after: list[str]
    grpc_port_served_by: str | None


def _soak(options: Options, records: Sequence[Mapping], services: Services, on_progress: OnProgress) -> Measured:
    """Valid traffic through the three phases, floods in the middle one, the process trees watched throughout."""
    planned, urls = int(options.seconds), services.urls
    grpc_port = host_port(urls["grpc"])[1]
    calls = Calls(urls["http"], urls["grpc"], urls["gateway"], records)
    watch, paths = None, []

    def supervisor() -> list[str]:
        return supervisor_counts(urls["supervisor"]) if urls.get("supervisor") else []
    try:
        # Every path warmed once: first-use costs are not the floods' doing. A path that cannot answer yet is not
        # a reason to stop; its phases' counts will show it.
        warm_up = {name: [o for o in guarded(call)(0) if o[0] != ANSWERED]
                   for name, (call, _rate) in path_calls(calls, options.rate).items()}
        owner = port_owner(grpc_port)
        supervisor_before = supervisor()
        clock = Clock(options.seconds)
        pids_before = serving_pids(services.serving_pid, grpc_port)
        every_s = options.sample_every_s or min(2.0, max(0.2, options.seconds / 120))
        watch = Watch(services.serving_pid, services.gateway_pid, clock, every_s)
        watch.look()
        watch.start()
        paths = [ValidPath(name, call, rate, clock) for name, (call, rate) in path_calls(calls, options.rate).items()]
        for path in paths:
            path.start()
        _wait_for_phase(clock, "during", on_progress, planned)
        flooding = ThreadPoolExecutor(1, thread_name_prefix="soak-floods")
        flood_results = flooding.submit(run_floods, FLOOD_SIZES[options.floods], urls, records, clock,
                                        frozenset(options.skip_floods))
        _wait_for_phase(clock, None, on_progress, planned)
        flood_results = flood_results.result()
        flooding.shutdown()
        for path in paths:
            path.join(VALID_TIMEOUT_S + 30)
        pids_after = serving_pids(services.serving_pid, grpc_port)
        supervisor_after = supervisor()
        watch.stop.set()
        watch.join(10)
        watch.look()
    finally:
        # On a failure too: no valid-path or watch thread goes on calling or sampling after the soak.
        for path in paths:
            path.stop.set()
        if watch is not None:
            watch.stop.set()
        calls.close()
    return Measured(watch, paths, flood_results, warm_up, pids_before, pids_after, supervisor_before,
                    supervisor_after, f"{owner[1]} (pid {owner[0]})" if owner else None)


def _wait_for_phase(clock: Clock, phase: str | None, on_progress: OnProgress, planned: int) -> None:
    """Until `phase` starts (None: until the run is over), telling the seconds gone once a second."""
    end = clock.at(clock.phases_s["before"]) if phase == "during" else clock.at(clock.seconds)
    while (now := time.monotonic()) < end:
        on_progress(min(planned, int(clock.elapsed())), planned, clock.phase())
        time.sleep(min(1.0, end - now))


def _stop(process) -> int | str:
    """The exit code after SIGTERM, or why there is none (killed after a minute: what it left is reported)."""
    try:
        return service_process.stop(process, timeout=60)
    except subprocess.TimeoutExpired:
        return "killed: still running 60 s after SIGTERM"
