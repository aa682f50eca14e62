"""The hostile soak's valid traffic: one paced caller per path (risk_pipeline over HTTP and gRPC, risk_stream, the
legacy gateway's Score, llm's generate_stream), each capped in flight, each request's outcome counted in the phase
it was sent in."""
from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from s2t.clients import stream_client
from s2t.clients.legacy_record import to_protobuf
from s2t.clients.llm_client import generate_stream
from s2t.soak.hostile import report
from s2t.soak.hostile.report import ANSWERED, FAILED, NOT_SENT, UNANSWERED, Sample
from s2t.wire.names import PAYLOAD

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


class Clock:
    """Seconds since the load started and the phase they fall in."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.phases_s = {phase: seconds * share for phase, share in PHASE_SHARES.items()}
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def phase(self) -> str:
        return report.phase_of(self.elapsed(), self.phases_s["before"], self.phases_s["during"])

    def at(self, elapsed_s: float) -> float:
        """The time.monotonic() value `elapsed_s` into the run."""
        return self.started + elapsed_s

    def during_ends(self) -> float:
        return self.at(self.phases_s["before"] + self.phases_s["during"])


Outcome = tuple[str, float | None, str]  # (outcome, latency_s, detail)


def guarded(call: Callable[[int], list[Outcome]]) -> Callable[[int], list[Outcome]]:
    """`call`, with a client that broke counted as a request without an answer instead of ending the soak."""
    def one(k: int) -> list[Outcome]:
        try:
            return call(k)
        except Exception as err:  # noqa: BLE001 - any client failure is that request's outcome
            return [(UNANSWERED, None, f"{type(err).__name__}: {err}")]
    return one


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
                    self._add([Sample(phase, NOT_SENT, at_s=k / self.rate)])
                else:
                    pool.submit(self._one, k, phase)
                k += 1

    def _one(self, k: int, phase: str) -> None:
        try:
            outcomes = guarded(self.call)(k)
        finally:
            with self._lock:
                self._in_flight -= 1
        self._add([Sample(phase, *o, at_s=k / self.rate) for o in outcomes])

    def _add(self, samples: list[Sample]) -> None:
        with self._lock:
            self.samples.extend(samples)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.rsplit(":", 1)
    return host, int(port)


class Calls:
    """One valid request on each path, with the client of each path made once (per thread where it must be)."""

    def __init__(self, http_url: str, grpc_url: str, gateway_url: str, records: Sequence[Mapping]):
        import grpc
        import tritonclient.grpc as grpcclient

        from s2t.wire import skill_pb2_grpc
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
        connection = http.client.HTTPConnection(*host_port(self.http_url), timeout=VALID_TIMEOUT_S)
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

        from s2t.wire import skill_pb2
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


def path_calls(calls: Calls, rate: float) -> dict[str, tuple[Callable[[int], list[Outcome]], float]]:
    # A stream or a gateway call carries 4 records: a quarter of the rate keeps the records per second alike; llm
    # answers take a CPU core each, so it gets a tenth.
    return {"risk_pipeline_http": (calls.pipeline_http, rate), "risk_pipeline_grpc": (calls.pipeline_grpc, rate),
            "risk_stream": (calls.stream, rate / RECORDS_PER_STREAM),
            "gateway": (calls.gateway, rate / RECORDS_PER_CALL), "llm": (calls.llm, rate / 10)}
