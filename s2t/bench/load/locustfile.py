"""Locust users sending real German Credit records to risk_pipeline, over HTTP (KServe v2 JSON) and gRPC.

Headless and bounded, with a pass/fail rule on the error rate:

    locust -f s2t/bench/load/locustfile.py --headless -u 8 -r 8 --run-time 30s --host http://localhost:8000 \
        HttpRecordUser GrpcRecordUser

Environment: S2T_GRPC_URL (gRPC HOST:PORT, default localhost:8001), S2T_DATA (German Credit CSV),
S2T_MAX_REQUESTS (stop after this many requests, 0: no limit), S2T_MAX_ERROR_RATE (exit 1 above it, default 0.01).
"""
import json
import os
import time
from itertools import cycle
from pathlib import Path

import gevent
from locust import FastHttpUser, User, events, task
from s2t.wire.names import DECISION, PAYLOAD

MODEL = "risk_pipeline"
DATA = Path(os.environ.get("S2T_DATA", "artifacts/data/germancredit.csv"))
MAX_REQUESTS = int(os.environ.get("S2T_MAX_REQUESTS", "0"))
MAX_ERROR_RATE = float(os.environ.get("S2T_MAX_ERROR_RATE", "0.01"))


def _payloads() -> list[bytes]:
    from s2t.bench.harness.workload import Workload
    return Workload.load(DATA).payloads()


PAYLOADS = _payloads()


class HttpRecordUser(FastHttpUser):
    """One record per request, as curl sends it (clients/examples/risk_pipeline_request.json)."""

    def on_start(self):
        from s2t.bench.harness.workload import triton_json_body
        self._bodies = cycle([triton_json_body(p) for p in PAYLOADS])

    @task
    def score(self):
        with self.client.post(f"/v2/models/{MODEL}/infer", data=next(self._bodies),
                              headers={"Content-Type": "application/json"}, name=f"http {MODEL}",
                              catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
            elif not _decisions(json.loads(response.text)):
                response.failure("no decision in the answer")


def _decisions(answer: dict) -> list:
    return next((o["data"] for o in answer.get("outputs", []) if o["name"] == "decision"), [])


_OPEN_GRPC_CLIENTS: set = set()


def _grpc_client(url: str):
    """A tritonclient gRPC client that is closed only by us, inside gevent's loop.

    tritonclient closes its channel again in __del__; at interpreter exit gevent's hub is gone and grpc's
    gevent-integrated close blocks forever (seen in CI: locust printed its summary, then hung past SIGTERM).
    """
    import tritonclient.grpc as grpcclient

    class LoopClosedClient(grpcclient.InferenceServerClient):
        def __del__(self):
            pass

    client = LoopClosedClient(url)
    _OPEN_GRPC_CLIENTS.add(client)
    return client


def _close_grpc_client(client) -> None:
    if client in _OPEN_GRPC_CLIENTS:
        _OPEN_GRPC_CLIENTS.discard(client)
        client.close()


class GrpcRecordUser(User):
    """tritonclient's gRPC client; gRPC's own threads are made cooperative with gevent first."""

    def on_start(self):
        import grpc.experimental.gevent as grpc_gevent
        grpc_gevent.init_gevent()
        import numpy as np
        import tritonclient.grpc as grpcclient
        self._np, self._grpcclient = np, grpcclient
        self._client = _grpc_client(os.environ.get("S2T_GRPC_URL", "localhost:8001"))
        self._payloads = cycle(PAYLOADS)

    def on_stop(self):
        _close_grpc_client(self._client)

    @task
    def score(self):
        payload = self._grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
        payload.set_data_from_numpy(self._np.array([[next(self._payloads)]], dtype=object))
        started, error, size = time.perf_counter(), None, 0
        try:
            result = self._client.infer(MODEL, [payload], client_timeout=30)
            size = result.as_numpy(DECISION).size
        except Exception as err:  # noqa: BLE001 - every failure is a failed request in the report
            error = err
        self.environment.events.request.fire(
            request_type="grpc", name=f"grpc {MODEL}", response_time=(time.perf_counter() - started) * 1000,
            response_length=size, exception=error, context={})


@events.init.add_listener
def _bound_requests(environment, **kwargs):
    """Stop the run after MAX_REQUESTS requests, whatever --run-time says."""
    if not MAX_REQUESTS:
        return

    quitting = []

    def count(**_):
        runner = environment.runner
        if runner is not None and not quitting and runner.stats.total.num_requests >= MAX_REQUESTS:
            quitting.append(gevent.spawn(runner.quit))

    environment.events.request.add_listener(count)


@events.test_stop.add_listener
def _close_grpc_clients(environment, **kwargs):
    """Users killed before their on_stop ran still have open channels: close them while gevent's loop runs."""
    for client in list(_OPEN_GRPC_CLIENTS):
        _close_grpc_client(client)


@events.quitting.add_listener
def _verdict(environment, **kwargs):
    """Pass/fail: the run fails above MAX_ERROR_RATE errors, or when nothing was sent at all."""
    total = environment.stats.total
    if total.num_requests == 0 or total.fail_ratio > MAX_ERROR_RATE:
        environment.process_exit_code = 1
    print(f"s2t-locust: {total.num_requests} requests, {total.num_failures} failures "
          f"({total.fail_ratio:.2%}, limit {MAX_ERROR_RATE:.2%}): {'FAIL' if environment.process_exit_code else 'PASS'}")
