"""`s2t soak --hostile`: valid traffic on every path while hostile clients try to starve, exhaust or reach past
the service, in three phases (before, during and after the floods), on `s2t serve --llm` and `s2t gateway` started
on free ports.

Valid paths, each paced at its own rate with a cap of requests in flight: risk_pipeline over HTTP and gRPC,
risk_stream (a short stream per request), the legacy gateway's Score, and llm's generate_stream (latency: time to
the first token). The floods (floods.py) all start when `during` starts and let go of what they hold
when it ends. The report says, per guarantee, whether it held (see report.py), from what was measured here:
nothing is assumed fixed.
"""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import psutil

from clients import stream_client
from clients.legacy_record import to_protobuf
from clients.llm_client import generate_stream
from s2t.bench.hostile import floods
from s2t.bench.hostile import report as soak_report
from s2t.bench.process_tree import rss_bytes
from s2t.bench.hostile.report import ANSWERED, FAILED, NOT_SENT, UNANSWERED, Sample
from s2t.on_progress import OnProgress, no_progress
from s2t.serve import service_process
from s2t.serve.supervisor import stubs_of
from s2t.serve.triton_server import free_port
from wire.names import PAYLOAD

# Longest a valid request is waited for before it counts as unanswered.
VALID_TIMEOUT_S = 30.0
# Requests of one valid path in flight at once; a tick beyond it is counted not sent rather than queued here.
MAX_IN_FLIGHT = 8
RECORDS_PER_STREAM = 4
RECORDS_PER_CALL = 4
LLM_MAX_TOKENS = 8
# A path's p99 above this is a broken latency target. Risk paths: a new client is served within 1 s; llm: time to
# the first token of a short prompt on one llama.cpp thread.
LATENCY_TARGETS_MS = {"risk_pipeline_http": 1000.0, "risk_pipeline_grpc": 1000.0, "risk_stream": 1000.0,
                      "gateway": 1000.0, "llm": 5000.0}
# Part of the run each phase takes.
PHASE_SHARES = {"before": 0.25, "during": 0.5, "after": 0.25}
SHM_DIR = Path("/dev/shm")
# After shutdown, processes and regions get this long to go before they count as left over.
SHUTDOWN_GRACE_S = 10.0


@dataclass(frozen=True)
class FloodSizes:
    idle_streams: int
    idle_gateway_calls: int
    big_record_callers: int
    big_records_per_call: int
    llm_disconnects: int
    bogus_routes: int
    oversized_bodies: int
    oversized_body_bytes: int


# full: the sizes that showed each weakness; light: enough of each to see it act, for a minute's run.
FLOOD_SIZES = {
    "full": FloodSizes(idle_streams=1100, idle_gateway_calls=8, big_record_callers=4, big_records_per_call=200,
                       llm_disconnects=300, bogus_routes=6000, oversized_bodies=10, oversized_body_bytes=64 << 20),
    "light": FloodSizes(idle_streams=150, idle_gateway_calls=4, big_record_callers=2, big_records_per_call=10,
                        llm_disconnects=6, bogus_routes=100, oversized_bodies=2, oversized_body_bytes=16 << 20),
}


class Clock:
    """Seconds since the load started and the phase they fall in."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.phases_s = {phase: seconds * share for phase, share in PHASE_SHARES.items()}
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def phase(self) -> str:
        return soak_report.phase_of(self.elapsed(), self.phases_s["before"], self.phases_s["during"])

    def at(self, elapsed_s: float) -> float:
        """The time.monotonic() value `elapsed_s` into the run."""
        return self.started + elapsed_s

    def during_ends(self) -> float:
        return self.at(self.phases_s["before"] + self.phases_s["during"])


Outcome = tuple[str, float | None, str]  # (outcome, latency_s, detail)


def _guarded(call: Callable[[int], list[Outcome]]) -> Callable[[int], list[Outcome]]:
    """`call`, with a client that broke counted as a request without an answer instead of ending the soak."""
    def guarded(k: int) -> list[Outcome]:
        try:
            return call(k)
        except Exception as err:  # noqa: BLE001 - any client failure is that request's outcome
            return [(UNANSWERED, None, f"{type(err).__name__}: {err}")]
    return guarded


class ValidPath(threading.Thread):
    """Calls `call(k)` `rate` times a second until the run is over, at most MAX_IN_FLIGHT at once; each call
    returns the outcomes of the requests it made, tagged with the phase it was started in."""

    def __init__(self, name: str, call: Callable[[int], list[Outcome]], rate: float, clock: Clock):
        super().__init__(name=f"soak-{name}", daemon=True)
        self.path, self.call, self.rate, self.clock = name, call, rate, clock
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self.stop = threading.Event()  # set: no more calls (the run failed before its end)

    def run(self) -> None:
        with ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix=self.name) as pool:
            k = 0
            while (due := self.clock.at(k / self.rate)) < self.clock.at(self.clock.seconds):
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    break
                phase = self.clock.phase()
                with self._lock:
                    full = self._in_flight >= MAX_IN_FLIGHT
                    self._in_flight += not full
                if full:
                    self._add([Sample(phase, NOT_SENT)])
                else:
                    pool.submit(self._one, k, phase)
                k += 1

    def _one(self, k: int, phase: str) -> None:
        try:
            outcomes = _guarded(self.call)(k)
        finally:
            with self._lock:
                self._in_flight -= 1
        self._add([Sample(phase, *o) for o in outcomes])

    def _add(self, samples: list[Sample]) -> None:
        with self._lock:
            self.samples.extend(samples)


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.rsplit(":", 1)
    return host, int(port)


class Calls:
    """One valid request on each path, with the client of each path made once (per thread where it must be)."""

    def __init__(self, http_url: str, grpc_url: str, gateway_url: str, records: Sequence[Mapping]):
        import grpc
        import tritonclient.grpc as grpcclient

        from wire import skill_pb2_grpc
        self.http_url, self.grpc_url, self.records = http_url, grpc_url, records
        self._grpcclient, self._local, self._clients = grpcclient, threading.local(), []
        self._channel = grpc.insecure_channel(gateway_url)
        self._skill = skill_pb2_grpc.SkillStub(self._channel)
        self._run = uuid.uuid4().hex[:8]

    def _payload(self, k: int) -> str:
        return json.dumps({"request_id": f"soak-{k}", "features": self.records[k % len(self.records)]})

    def pipeline_http(self, k: int) -> list[Outcome]:
        body = json.dumps({"inputs": [{"name": PAYLOAD, "shape": [1, 1], "datatype": "BYTES",
                                       "data": [self._payload(k)]}]})
        connection = http.client.HTTPConnection(*_host_port(self.http_url), timeout=VALID_TIMEOUT_S)
        started = time.perf_counter()
        try:
            connection.request("POST", "/v2/models/risk_pipeline/infer", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read()
        except (OSError, http.client.HTTPException) as err:
            return [(UNANSWERED, None, f"{type(err).__name__}: {err}")]
        finally:
            connection.close()
        latency = time.perf_counter() - started
        if response.status != 200:
            return [(FAILED, latency, f"HTTP {response.status}: {text[:160].decode(errors='replace')}")]
        return [(ANSWERED, latency, "")]

    def pipeline_grpc(self, k: int) -> list[Outcome]:
        from tritonclient.utils import InferenceServerException
        if not hasattr(self._local, "client"):
            self._local.client = self._grpcclient.InferenceServerClient(self.grpc_url)
            self._clients.append(self._local.client)
        tensor = self._grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[self._payload(k).encode()]], dtype=object))
        started = time.perf_counter()
        try:
            self._local.client.infer("risk_pipeline", [tensor], client_timeout=VALID_TIMEOUT_S)
        except InferenceServerException as err:
            gave_up = err.status() == "StatusCode.DEADLINE_EXCEEDED"
            return [(UNANSWERED if gave_up else FAILED, None if gave_up else time.perf_counter() - started,
                     f"{err.status()} {err.message()[:160]}")]
        return [(ANSWERED, time.perf_counter() - started, "")]

    def stream(self, k: int) -> list[Outcome]:
        rows = [{"features": self.records[(k + i) % len(self.records)]} for i in range(RECORDS_PER_STREAM)]
        result = stream_client.run_stream(self.grpc_url, f"soak-{self._run}-{k}", rows,
                                          list(range(RECORDS_PER_STREAM)), timeout_s=VALID_TIMEOUT_S)
        out: list[Outcome] = [(ANSWERED, a.latency_s, "") if a.status == "OK" else (FAILED, a.latency_s, a.status)
                              for a in result.answers]
        out += [(FAILED, None, error[:160]) for error in result.errors]
        out += [(UNANSWERED, None, "no final response")] * (RECORDS_PER_STREAM - result.finals)
        return out

    def gateway(self, k: int) -> list[Outcome]:
        import grpc

        from wire import skill_pb2
        records = [to_protobuf({"request_id": f"soak-{k}-{i}", "features": self.records[(k + i) % len(self.records)]})
                   for i in range(RECORDS_PER_CALL)]
        started = time.perf_counter()
        try:
            result = self._skill.Score(iter(records), timeout=VALID_TIMEOUT_S)
        except grpc.RpcError as err:
            gave_up = err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and err.details() == "Deadline Exceeded"
            return [(UNANSWERED if gave_up else FAILED, None if gave_up else time.perf_counter() - started,
                     f"{err.code().name} {(err.details() or '')[:160]}")]
        latency = time.perf_counter() - started
        bad = [r for r in result.results if r.status != skill_pb2.OK]
        if bad or len(result.results) != RECORDS_PER_CALL:
            return [(FAILED, latency, f"{len(bad)} of {len(result.results)} records not OK: {bad[0].error[:120]}"
                     if bad else f"{len(result.results)} results for {RECORDS_PER_CALL} records")]
        return [(ANSWERED, latency, "")]

    def llm(self, k: int) -> list[Outcome]:
        try:
            result = generate_stream(self.http_url, {"text_input": f"Say hello to applicant {k}.",
                                                     "max_tokens": LLM_MAX_TOKENS}, timeout=VALID_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as err:
            return [(UNANSWERED, None, f"{type(err).__name__}: {err}")]
        if result.error is not None:
            return [(FAILED, time.monotonic() - result.started, f"HTTP {result.status}: {result.error[:160]}")]
        ttft = result.ttft
        return [(ANSWERED, ttft if ttft is not None else time.monotonic() - result.started, "")]

    def close(self) -> None:
        self._channel.close()
        for client in self._clients:
            client.close()


def _paths(calls: Calls, rate: float) -> dict[str, tuple[Callable[[int], list[Outcome]], float]]:
    # A stream or a gateway call carries 4 records: a quarter of the rate keeps the records per second alike; llm
    # answers take a CPU core each, so it gets a tenth.
    return {"risk_pipeline_http": (calls.pipeline_http, rate), "risk_pipeline_grpc": (calls.pipeline_grpc, rate),
            "risk_stream": (calls.stream, rate / RECORDS_PER_STREAM),
            "gateway": (calls.gateway, rate / RECORDS_PER_CALL), "llm": (calls.llm, rate / 10)}


# ---------------------------------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Seen:
    pid: int
    created: float
    name: str


def _alive(seen: Seen) -> bool:
    """Still running: the same process (not a new one with its pid), and not a zombie waiting to be reaped."""
    try:
        proc = psutil.Process(seen.pid)
        return proc.create_time() == seen.created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Watch(threading.Thread):
    """Samples, every `every_s`, the RSS of the serving tree (s2t serve, tritonserver, stubs) and of the gateway,
    and remembers every process of both trees and every stub's shared-memory region."""

    def __init__(self, serve_pid: int | None, gateway_pid: int | None, clock: Clock, every_s: float):
        super().__init__(name="soak-watch", daemon=True)
        self.serve_pid, self.gateway_pid, self.clock, self.every_s = serve_pid, gateway_pid, clock, every_s
        self.rss: dict[str, dict[str, dict[str, int]]] = {"serving": {}, "gateway": {}}
        self.seen: dict[int, Seen] = {}
        self.regions: set[str] = set()
        self.stop = threading.Event()

    def look(self) -> None:
        for root in (self.serve_pid, self.gateway_pid):
            if root is None:
                continue
            try:
                tree = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                try:
                    self.seen.setdefault(proc.pid, Seen(proc.pid, proc.create_time(), _name(proc)))
                except psutil.NoSuchProcess:
                    continue
        server = tritonserver_pid(self.serve_pid)
        if server is not None:
            for stub in stubs_of(server):
                try:
                    # The stub's second argument is its shared-memory region, created as /dev/shm/<name>.
                    self.regions.add(psutil.Process(stub).cmdline()[2].lstrip("/"))
                except (psutil.NoSuchProcess, IndexError):
                    continue

    def sample(self) -> None:
        phase = self.clock.phase()
        for group, pid in (("serving", self.serve_pid), ("gateway", self.gateway_pid)):
            if pid is None:
                continue
            try:
                size = rss_bytes(pid)
            except psutil.NoSuchProcess:
                continue
            row = self.rss[group].setdefault(phase, {"max": 0, "last": 0, "samples": 0})
            row.update(max=max(row["max"], size), last=size, samples=row["samples"] + 1)

    def run(self) -> None:
        while not self.stop.is_set():
            self.look()
            self.sample()
            self.stop.wait(self.every_s)


def _name(proc: psutil.Process) -> str:
    cmd = proc.cmdline()
    stub = next((a for a in cmd if a.endswith("_0") or "_0_" in a), None)
    return stub or " ".join(cmd[:3])[:80] or proc.name()


def tritonserver_pid(serving_pid: int | None) -> int | None:
    """tritonserver: the process itself, or the child of `s2t serve` by that name."""
    if serving_pid is None:
        return None
    try:
        root = psutil.Process(serving_pid)
        if root.name() == "tritonserver":
            return serving_pid
        return next((p.pid for p in root.children() if p.name() == "tritonserver"), None)
    except psutil.NoSuchProcess:
        return None


def serving_pids(serve_pid: int | None) -> dict[str, int]:
    """tritonserver's pid and each stub's, by model instance and version."""
    server = tritonserver_pid(serve_pid)
    if server is None:
        return {}
    return {"tritonserver": server, **{f"{s.instance}@{s.version}": pid for pid, s in stubs_of(server).items()}}


def shm_entries() -> list[str]:
    try:
        return sorted(p.name for p in SHM_DIR.iterdir())
    except OSError:
        return []


def run_processes() -> list[str]:
    """This process's descendants, as `pid name`."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            out.append(f"{proc.pid} {_name(proc)}")
        except psutil.NoSuchProcess:
            continue
    return out


# ---------------------------------------------------------------------------------------------------- floods


def _metrics_page(metrics_url: str) -> str:
    connection = http.client.HTTPConnection(*_host_port(metrics_url), timeout=30)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return ""
    finally:
        connection.close()


def supervisor_counts(supervisor_url: str) -> list[str]:
    """What `s2t serve`'s supervisor did during the run (reloads by model and reason, models given up, server
    restarts), as its metric samples: a changed stub pid is explained here or nowhere."""
    return [line for line in _metrics_page(supervisor_url).splitlines() if line and not line.startswith("#")]


def run_floods(sizes: FloodSizes, urls: Mapping[str, str], records: Sequence[Mapping], clock: Clock) -> dict:
    """Every flood in its own thread from the start of `during`; each lets go by its end."""
    hold_until = clock.during_ends()
    results: dict[str, dict] = {}
    metrics_before = _metrics_page(urls["metrics"])

    def routes() -> dict:
        result, sent = floods.bogus_routes(urls["grpc"], records, sizes.bogus_routes, hold_until)
        page = _metrics_page(urls["metrics"])
        leaked = [r for r in sent if r in page]
        return {**result, "metrics_bytes_before": len(metrics_before), "metrics_bytes_after": len(page),
                "leaked_labels": len(leaked)}

    jobs = {
        "idle_streams": lambda: floods.idle_streams(urls["grpc"], records, sizes.idle_streams, hold_until),
        "idle_gateway_calls": lambda: floods.idle_gateway_calls(urls["gateway"], records, sizes.idle_gateway_calls,
                                                                hold_until),
        "big_records": lambda: floods.big_records(urls["gateway"], records, sizes.big_record_callers,
                                                  sizes.big_records_per_call, hold_until),
        "llm_disconnects": lambda: floods.llm_disconnects(urls["http"], sizes.llm_disconnects, hold_until),
        "bogus_routes": routes,
        "oversized_bodies": lambda: floods.oversized_bodies(urls["http"], sizes.oversized_bodies,
                                                            sizes.oversized_body_bytes, hold_until),
    }

    def run(name: str, job: Callable[[], dict]) -> None:
        try:
            results[name] = job()
        except Exception as err:  # noqa: BLE001 - a flood client that broke is reported, the soak goes on
            results[name] = {"sent": 0, "outcomes": {f"flood client failed: {type(err).__name__}: {err}"[:200]: 1},
                             "unanswered": 0}

    threads = [threading.Thread(target=run, args=item, name=f"flood-{item[0]}", daemon=True)
               for item in jobs.items()]
    for thread in threads:
        thread.start()
    probes = floods.api_probes(urls["http"], urls["grpc"])
    results["api_probes"] = {"sent": len(probes), "outcomes": {
        f"{p['probe']}: {'refused' if p['refused'] else 'reached'} ({p['status']})": 1 for p in probes},
        "unanswered": sum(p["unanswered"] for p in probes), "probes": probes}
    for thread in threads:
        # Every flood is over by the end of `during`; a request of one may still be waited for, within its timeout.
        thread.join(max(0.0, hold_until - time.monotonic()) + floods.REQUEST_TIMEOUT_S + 5)
    for name in jobs:
        results.setdefault(name, {"sent": 0, "outcomes": {"still running after its time": 1}, "unanswered": 1})
    return {name: results[name] for name in (*jobs, "api_probes")}


# ---------------------------------------------------------------------------------------------------- the run


@dataclass
class Options:
    seconds: float
    rate: float
    floods: str = "full"
    latency_targets_ms: Mapping[str, float] | None = None
    sample_every_s: float = 2.0


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
    listening = {}
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.pid:
                listening[conn.laddr.port] = conn.pid
    except psutil.AccessDenied:
        pass  # another user's processes: RSS, restarts and leftovers are then reported not measured
    server = listening.get(_host_port(urls["http"])[1])
    if server is not None:
        parent = psutil.Process(server).parent()
        # `s2t serve` keeps tritonserver as its child: watch the whole tree, its supervisor included.
        if parent is not None and "serve" in parent.cmdline():
            server = parent.pid
    return Services(dict(urls), server, listening.get(_host_port(urls["gateway"])[1]), started=False)


def run(options: Options, records: Sequence[Mapping], on_progress: OnProgress = no_progress,
        urls: Mapping[str, str] | None = None, log_base: Path | None = None) -> dict:
    """Soak the services at `urls` ("http", "grpc", "metrics", "gateway"), or start them (and stop them) when
    None (their output then next to `log_base`); the report as a dict (JSON-ready)."""
    planned = int(options.seconds)
    shm_before, processes_before = shm_entries(), run_processes()
    if urls is None:
        with started_services(on_progress, planned, log_base) as services:
            measured = _soak(options, records, services, on_progress)
    else:
        services = running_services(urls)
        measured = _soak(options, records, services, on_progress)
    watch, pids_before, pids_after, paths, flood_results, warm_up, supervisor = measured
    left, regions_left = leftovers(watch) if services.started else ([], [])
    shm_after = shm_entries()
    targets = {**LATENCY_TARGETS_MS, **(options.latency_targets_ms or {})}
    paths_summary = {path.path: soak_report.path_summary(path.samples) for path in paths}
    bogus = flood_results.get("bogus_routes", {})
    report = {
        "seconds": options.seconds, "rate": options.rate, "floods_size": options.floods,
        "flood_sizes": asdict(FLOOD_SIZES[options.floods]), "phases_s": watch.clock.phases_s,
        "services": {"urls": dict(services.urls), "started_by_the_soak": services.started,
                     "serving_pid": services.serving_pid, "gateway_pid": services.gateway_pid},
        "latency_targets_ms": targets, "paths": paths_summary, "floods": flood_results,
        "warm_up_failures": {name: [f"{o[0]}: {o[2]}"[:200] for o in out] for name, out in warm_up.items() if out},
        "rss": {group: {p: phases[p] for p in soak_report.PHASES if p in phases}
                for group, phases in watch.rss.items()},
        "pids": {"before": pids_before, "after": pids_after}, "supervisor": supervisor,
        "exit_codes": services.exit_codes,
        "shm": {"before": len(shm_before), "after": len(shm_after),
                "new": sorted(set(shm_after) - set(shm_before)), "gone": sorted(set(shm_before) - set(shm_after)),
                "regions_of_the_run": sorted(watch.regions), "regions_left": regions_left},
        "processes": {"before": processes_before, "after": run_processes(),
                      "seen": len(watch.seen), "left": left},
    }
    not_stopped = soak_report.not_measured("the services were not started, so not stopped, by this run")
    report["verdicts"] = {
        "every_request_answered": soak_report.every_request_answered(paths_summary, flood_results),
        "valid_requests_succeeded": soak_report.valid_requests_succeeded(paths_summary),
        "latency_targets_kept": soak_report.latency_targets_kept(paths_summary, targets),
        "no_process_restarts": soak_report.no_restarts(pids_before, pids_after),
        "rss_flat": soak_report.rss_flat(report["rss"]),
        "metric_labels_from_configuration": soak_report.labels_from_configuration(bogus.get("leaked_labels", 0),
                                                                                  bogus.get("sent", 0)),
        "admin_apis_restricted": soak_report.apis_restricted(flood_results["api_probes"]["probes"]),
        "no_shm_region_left": soak_report.nothing_left("shared-memory regions", regions_left)
        if services.started else not_stopped,
        "no_process_left": soak_report.nothing_left("processes", left + report["processes"]["after"])
        if services.started else not_stopped,
    }
    return report


def _soak(options: Options, records: Sequence[Mapping], services: Services, on_progress: OnProgress):
    """Valid traffic through the three phases, floods in the middle one, the process trees watched throughout."""
    planned, urls = int(options.seconds), services.urls
    calls = Calls(urls["http"], urls["grpc"], urls["gateway"], records)
    watch, paths = None, []
    try:
        # Every path warmed once: first-use costs are not the floods' doing. A path that cannot answer yet is not
        # a reason to stop; its phases' counts will show it.
        warm_up = {name: [o for o in _guarded(call)(0) if o[0] != ANSWERED]
                   for name, (call, _rate) in _paths(calls, options.rate).items()}
        clock = Clock(options.seconds)
        pids_before = serving_pids(services.serving_pid)
        watch = Watch(services.serving_pid, services.gateway_pid, clock, options.sample_every_s)
        watch.look()
        watch.start()
        paths = [ValidPath(name, call, rate, clock) for name, (call, rate) in _paths(calls, options.rate).items()]
        for path in paths:
            path.start()
        _wait_for_phase(clock, "during", on_progress, planned)
        flooding = ThreadPoolExecutor(1, thread_name_prefix="soak-floods")
        flood_results = flooding.submit(run_floods, FLOOD_SIZES[options.floods], urls, records, clock)
        _wait_for_phase(clock, None, on_progress, planned)
        flood_results = flood_results.result()
        flooding.shutdown()
        for path in paths:
            path.join(VALID_TIMEOUT_S + 30)
        pids_after = serving_pids(services.serving_pid)
        supervisor = supervisor_counts(urls["supervisor"]) if "supervisor" in urls else []
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
    return watch, pids_before, pids_after, paths, flood_results, warm_up, supervisor


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


def leftovers(watch: Watch | None, grace_s: float = SHUTDOWN_GRACE_S) -> tuple[list[str], list[str]]:
    """Processes of the run still alive and regions of its stubs still in /dev/shm, after `grace_s` for exits."""
    if watch is None:
        return [], []
    deadline = time.monotonic() + grace_s
    while True:
        alive = [f"{s.pid} {s.name}" for s in watch.seen.values() if _alive(s) and s.pid != os.getpid()]
        regions = sorted(r for r in watch.regions if (SHM_DIR / r).exists())
        if (not alive and not regions) or time.monotonic() > deadline:
            return alive, regions
        time.sleep(0.5)
