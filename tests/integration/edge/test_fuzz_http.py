"""The served HTTP port under generated hostile requests (s2t/gate/hostile_requests.py), one after another from one
caller, while four callers send valid requests beside it: every valid answer is the one a quiet server gave, every
request that must be refused gets a 4xx, none gets a 5xx or a dropped connection, and the same tritonserver serves
to the end. A failure names the request by its seed and index: `http_request(models, records, SEED, index)` makes
it again."""
from __future__ import annotations

import collections
import http.client
import json
import threading
import time

import pytest

from s2t.gate.hostile_requests import HttpRequest, http_request, infer_path
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.edge.served_models import fuzzed_models, valid_records
from tests.integration.servers import serving, triton_server

SEED = 20261206
REQUESTS = 2000
BUDGET_S = 110  # the fuzzer's share of the test; its requests stop here even if some are left
VALID_CALLERS = 4
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("fuzz_http") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


class Caller:
    """One keep-alive connection, opened again whenever the server closed it after an answer, so that a request is
    never blamed for the previous answer's close."""

    def __init__(self, port: int):
        self.port = port
        self.connection: http.client.HTTPConnection | None = None

    def send(self, method: str, path: str, body: bytes, headers: dict) -> tuple[str, int, bytes]:
        """(outcome, status, body): answered (2xx), refused (4xx), server error (5xx, 1xx, 3xx), dropped."""
        for attempt in (0, 1):
            fresh = self.connection is None
            if fresh:
                self.connection = http.client.HTTPConnection("localhost", self.port, timeout=TIMEOUT_S)
            try:
                self.connection.request(method, path, body=body, headers=headers)
                response = self.connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as err:
                self.close()
                # a keep-alive connection the server closed between two requests: once more on a new one
                if not fresh and attempt == 0 and isinstance(err, (http.client.RemoteDisconnected,
                                                                   ConnectionResetError, BrokenPipeError)):
                    continue
                return "dropped", 0, repr(err).encode()
            if response.will_close:
                self.close()
            status = response.status
            outcome = ("answered" if 200 <= status < 300 else "refused" if 400 <= status < 500 or expired(status, data)
                       else "server error")
            return outcome, status, data
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def expired(status: int, body: bytes) -> bool:
    """Triton's 503 for a request whose own `timeout` parameter expired in the queue: an answer to what the caller
    asked, not a server error."""
    return status == 503 and body == b'{"error":"Request timeout expired"}'


def pipeline_body(record: bytes, request_id: str) -> bytes:
    return json.dumps({"id": request_id, "inputs": [{"name": "payload", "datatype": "BYTES", "shape": [1, 1],
                                                     "data": [record.decode()]}]}).encode()


def verdict(request: HttpRequest, outcome: str) -> str | None:
    """What is wrong with `outcome` for `request`, or None."""
    if outcome in ("dropped", "server error"):
        return outcome
    if request.refused and outcome == "answered":
        return "answered a request that must be refused"
    return None


def test_hostile_http_requests_beside_valid_traffic_are_refused_alone(server, german_credit_data):
    records = valid_records(german_credit_data, 16)
    models = fuzzed_models()
    path = infer_path("risk_pipeline")
    headers = {"Content-Type": "application/json"}
    quiet = Caller(server.http_port)
    expected = {}
    for i, record in enumerate(records):
        outcome, status, data = quiet.send("POST", path, pipeline_body(record, str(i)), headers)
        assert outcome == "answered", (status, data)
        expected[i] = json.loads(data)
    quiet.close()

    pid = server.process.pid
    done = threading.Event()
    valid_wrong: list = []
    valid_count = collections.Counter()
    lock = threading.Lock()

    def valid(offset: int) -> None:
        caller, i = Caller(server.http_port), offset
        while not done.is_set():
            i = (i + 1) % len(records)
            outcome, status, data = caller.send("POST", path, pipeline_body(records[i], str(i)), headers)
            with lock:
                valid_count[outcome] += 1
                if outcome != "answered" or json.loads(data) != expected[i]:
                    valid_wrong.append((i, outcome, status, data[:300]))
        caller.close()

    threads = [threading.Thread(target=valid, args=(n * 4,)) for n in range(VALID_CALLERS)]
    for thread in threads:
        thread.start()
    outcomes, by_kind, failures = collections.Counter(), collections.Counter(), []
    caller, deadline, sent = Caller(server.http_port), time.monotonic() + BUDGET_S, 0
    try:
        for index in range(REQUESTS):
            if time.monotonic() > deadline or server.process.poll() is not None:
                break
            request = http_request(models, records, SEED, index)
            outcome, status, data = caller.send(request.method, request.path, request.body, dict(request.headers))
            sent += 1
            outcomes[outcome] += 1
            wrong = verdict(request, outcome)
            if wrong:
                by_kind[(request.kind.split(" + ")[0], wrong)] += 1
                failures.append(f"index {index} ({request.kind}): {wrong}, HTTP {status}: {data[:200]!r}")
    finally:
        caller.close()
        done.set()
        for thread in threads:
            thread.join()
    alive = server.process.poll() is None
    print(f"\nHTTP fuzz, seed {SEED}: {sent} requests sent: {dict(outcomes)}; valid traffic: {dict(valid_count)}")
    for (kind, wrong), n in by_kind.most_common():
        print(f"  {n:5d} {wrong}: {kind}")
    for line in failures[:20]:
        print("  " + line)
    assert alive and server.process.pid == pid, (
        f"tritonserver died (exit {server.process.returncode}) after request index {sent - 1}: {failures[-1:]}")
    assert failures == [], f"{len(failures)} of {sent} hostile requests answered wrongly; first: {failures[:5]}"
    assert valid_wrong == [], f"{len(valid_wrong)} valid requests failed; first: {valid_wrong[:5]}"
    assert sent == REQUESTS, f"only {sent} of {REQUESTS} requests within {BUDGET_S} s"
