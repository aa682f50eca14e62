"""Caller errors never make the supervisor act: a fifth of the records invalid for 15 s (three times the error-rate
watch's 5 s window), and forced routes to models and versions that do not exist, beside valid traffic on a
supervised server. Each bad request is its own 4xx naming
what is wrong, every valid one is scored exactly, and nothing is reloaded, given up or replaced: healing reacts to
the model's own failures only."""
from __future__ import annotations

import itertools
import json
import threading
import time

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from s2t.serve.healing import SupervisorState
from s2t.serve.supervisor import stubs_of
from tests.conftest import ENSEMBLES
from tests.integration.servers import repository_copies, serving, triton_server

SECONDS = 15.0
CALLERS = 4


def invalid_records(row: dict) -> list[tuple[bytes, str]]:
    """(payload, the text its error must hold): one of each kind a caller gets wrong."""
    missing = {k: v for k, v in row.items() if k != "credit_history"}
    wrong_type = {**row, "credit_amount": "a lot"}
    return [
        (json.dumps({"features": missing}).encode(), "features.credit_history: missing"),
        (json.dumps({"features": wrong_type}).encode(), "features.credit_amount"),
        (b"{not json", "payload: not valid JSON"),
        (json.dumps({"features": row, "pad": "x" * 70_000}).encode(), "over the limit"),
        (json.dumps({"features": row, "request_id": "r" * 300}).encode(), "request_id"),
    ]


def forced_routes() -> list[tuple[str, str]]:
    return [("risk_scorer:999999", "route: risk_scorer has no version 999999"),
            ("no_such_model", "route:"), ("risk_scorer_lite:0", "route:")]


def infer(client, model: str, payload: bytes, parameters=None):
    tensor = http.InferInput("payload", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
    return client.infer(model, [tensor], parameters=parameters)


@pytest.fixture
def supervised(built_artifacts, tmp_path):
    repo, _ = repository_copies(tmp_path)
    state = SupervisorState(path=tmp_path / "supervisor.json")
    replaced = []
    server = triton_server([repo, ENSEMBLES], tmp_path / "triton.log", supervise=True, supervisor_state=state,
                           on_replace=replaced.append)
    with serving(server) as running:
        yield running, state, replaced, repo


def test_a_fifth_of_invalid_records_and_forced_unknown_routes_for_15_s_reload_and_replace_nothing(
        supervised, german_credit_data):
    from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.triton_config import backend_parameters, load

    server, state, replaced, repo = supervised
    rows = german_credit_data.records()[:40]
    valid = [json.dumps({"request_id": f"v-{i}", "features": r}).encode() for i, r in enumerate(rows)]
    settings = read_parameters(PipelineSettings, backend_parameters(load(repo / "risk_pipeline")))
    expected = warm_pipeline(repo, settings, "risk_pipeline").score(valid).probability.ravel()
    bad = [b for row in rows[:4] for b in invalid_records(row)]
    pid, stubs = server.process.pid, set(stubs_of(server.process.pid))
    outcomes: list[tuple[str, str, object]] = []  # (kind, what must hold, outcome)
    lock = threading.Lock()
    deadline = time.monotonic() + SECONDS

    def caller(index: int) -> None:
        client = http.InferenceServerClient(server.http_url, network_timeout=60)
        sequence = itertools.count(index)
        try:
            while time.monotonic() < deadline:
                n = next(sequence)
                if n % 5 == 0:  # a fifth invalid, round robin over the kinds and both entry models
                    payload, must = bad[(n // 5) % len(bad)]
                    model = "risk_router" if (n // 5) % 2 else "risk_pipeline"
                    kind, params = f"invalid {model}", None
                elif n % 5 == 1 and index % 2:  # forced routes to nothing served, from half the callers
                    (route, must), payload = forced_routes()[n % 3], valid[n % len(valid)]
                    model, kind, params = "risk_router", "route", {"route": route}
                else:
                    model, kind, params = "risk_pipeline", "valid", None
                    payload, must = valid[n % len(valid)], str(n % len(valid))
                try:
                    outcome = infer(client, model, payload, params)
                    outcome = outcome.as_numpy("probability").ravel()[0]
                except InferenceServerException as err:
                    outcome = err
                with lock:
                    outcomes.append((kind, must, outcome))
        finally:
            client.close()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SECONDS + 120)

    kinds = {kind for kind, _, _ in outcomes}
    assert kinds == {"valid", "invalid risk_pipeline", "invalid risk_router", "route"}, kinds
    for kind, must, outcome in outcomes:
        if kind == "valid":
            assert not isinstance(outcome, Exception), outcome
            assert outcome == expected[int(must)]
        else:
            assert isinstance(outcome, InferenceServerException), (kind, must, outcome)
            assert outcome.status() == "400" and must in outcome.message(), (kind, must, outcome.message())
    invalid = sum(kind != "valid" for kind, _, _ in outcomes)
    assert invalid >= 0.2 * len(outcomes) - CALLERS, (invalid, len(outcomes))
    # Past the error-rate watch's 5 s several times over: it had every chance to act.
    time.sleep(2)
    record = state.to_dict()
    assert record["reloads"] == [] and record["given_up"] == [] and record["server_restarts"] == 0, record
    assert replaced == []
    assert server.process.poll() is None and server.process.pid == pid
    assert set(stubs_of(pid)) == stubs, "every stub is the one it started with: nothing was reloaded"
