"""Every error path of every python model answers each request of a concurrent batch on its own, and the server
(the same tritonserver process) keeps serving.

Triton 2.51's python backend crashes the whole server when one `TritonError` object is shared by several
responses of a batch; these tests send concurrent batches down each path that builds error responses: records
that no decoder may raise on, `route` values the router does not serve, and (through fault points) the
catch-all of every python model.
"""
import json
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from s2t.backends.runtime.fault_points import ENVIRONMENT_VARIABLE
from s2t.clients import stream_client
from s2t.clients.llm_client import generate_stream
from tests.conftest import ENSEMBLES, LLM_REPOSITORY, MODEL_REPOSITORY
from tests.integration.servers import triton_server

CONCURRENCY = 30
ROUNDS = 4
TOLERANCE = 1e-5


def payload_tensor(payloads):
    tensor = grpcclient.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(payloads, dtype=object).reshape(-1, 1))
    return tensor


def with_huge_integer(record: dict, digits: int = 5000) -> bytes:
    """The record with a JSON integer longer than Python converts (4,300 digits) in a field nobody reads."""
    return json.dumps(record).encode()[:-1] + b', "pad": ' + b"1" * digits + b"}"


def ask(url, model, payload, parameters=None):
    """(probability, None) or (None, (status, message)); one client per call, as independent callers. A record
    the router's fallback answered has no legacy score to compare with: its probability reads None."""
    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(model, [payload_tensor([payload])], parameters=parameters, client_timeout=60)
        served_by = result.as_numpy("served_by")
        if served_by is not None and not served_by[0, 0].startswith(b"risk_scorer:"):
            return None, None
        return float(result.as_numpy("probability")[0, 0]), None
    except InferenceServerException as err:
        return None, (err.status(), err.message() or "")
    finally:
        client.close()


def concurrent_rounds(url, calls):
    """Each round sends every call at once (CONCURRENCY threads): batches mix good and bad requests."""
    answers = []
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        for _ in range(ROUNDS):
            answers += list(pool.map(lambda call: (call, ask(url, *call[1:])), calls))
    return answers


@pytest.fixture(scope="module")
def rows(german_credit_data):
    return german_credit_data.records()


def assert_same_server_serving(server, pid, url):
    assert server.process.poll() is None, f"tritonserver exited with {server.process.returncode}"
    assert server.process.pid == pid
    client = grpcclient.InferenceServerClient(url)
    try:
        assert client.is_server_ready()
        for model in ("risk_pipeline", "risk_router", "risk_stream", "skill_adapter", "risk_scorer"):
            assert client.is_model_ready(model), model
    finally:
        client.close()


@pytest.mark.parametrize("model", ["risk_pipeline", "risk_router"])
def test_records_with_an_integer_of_5000_digits_are_refused_in_concurrent_batches_and_the_server_stays_up(
        triton, rows, legacy_scores, model):
    pid = triton.process.pid
    calls = []
    for i in range(CONCURRENCY):
        record = {"request_id": f"huge-{i}", "features": rows[i]}
        calls.append((("bad", i) if i % 2 else ("good", i), model,
                      with_huge_integer(record) if i % 2 else json.dumps(record).encode()))
    for ((kind, i), *_), (probability, error) in concurrent_rounds(triton.grpc_url, calls):
        if kind == "good":
            assert error is None, error
            assert abs(probability - legacy_scores[i]) <= TOLERANCE
        else:
            assert error is not None and error[0] == "StatusCode.INVALID_ARGUMENT", error
            assert "payload: a JSON integer has more than 4300 digits" in error[1]
    assert_same_server_serving(triton, pid, triton.grpc_url)


@pytest.mark.parametrize("route, reason", [
    (1, "route: expected a string, got int"),
    (True, "route: expected a string, got boolean"),
    ("x" * 300, "route: 300 characters is over the limit"),
    ("/", "route: '/' is not served here"),
    ("../..", "route: '../..' is not served here"),
    ("risk_decision", "route: 'risk_decision' is not served here"),
])
def test_a_route_the_router_does_not_serve_is_refused_naming_route_in_concurrent_batches(
        triton, rows, legacy_scores, route, reason):
    pid = triton.process.pid
    calls = [(("bad" if i % 2 else "good", i), "risk_router", json.dumps({"features": rows[i]}).encode(),
              {"route": route} if i % 2 else None) for i in range(CONCURRENCY)]
    for ((kind, i), *_), (probability, error) in concurrent_rounds(triton.grpc_url, calls):
        if kind == "good":
            assert error is None and abs(probability - legacy_scores[i]) <= TOLERANCE, error
        else:
            assert error == ("StatusCode.INVALID_ARGUMENT", reason) or (
                error[0] == "StatusCode.INVALID_ARGUMENT" and error[1].startswith(reason)), error
    assert_same_server_serving(triton, pid, triton.grpc_url)


def test_stream_records_with_an_integer_of_5000_digits_are_refused_and_every_stream_goes_on(triton, rows):
    pid = triton.process.pid
    records = [{"features": r} for r in rows[:3]]
    huge = with_huge_integer({"sequence_id": 1, "features": rows[1]})
    results = [None] * 16

    def stream(k):
        results[k] = stream_client.run_stream(triton.grpc_url, f"huge-{k}-{threading.get_ident()}", records,
                                              [0, 1, 2, 2], payloads={2: huge} if k % 2 else None)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, result in enumerate(results):
        assert result.complete, f"stream {k}: {result.finals} of 4 requests answered"
        assert [(a.status, a.sequence_id) for a in result.answers][:3] == [("OK", 0), ("OK", 1), ("OK", 2)]
        if k % 2:
            assert len(result.errors) == 1 and "payload: a JSON integer has more than 4300 digits" in result.errors[0]
    assert_same_server_serving(triton, pid, triton.grpc_url)


FAULT_POINTS = ("risk_pipeline.execute", "skill_adapter.execute", "onnxruntime.execute", "risk_decision.execute",
                "risk_router.execute", "risk_stream.execute", "risk_stream.timer", "llm.execute",
                "risk_explainer.execute")


@pytest.fixture(scope="module")
def faulty_server(built_artifacts, tmp_path_factory):
    """A server whose python models fail a third of their batches in their catch-all paths. Its repository is a
    copy without the scorers' warm-up: a warm-up batch that fails stops tritonserver 2.51 while it loads."""
    root = tmp_path_factory.mktemp("faults")
    repository = root / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    for config in repository.glob("*/config.pbtxt"):
        config.write_text(re.sub(r"\nmodel_warmup \[.*?\n\]\n", "\n", config.read_text(), flags=re.S))
    llm_repository = root / "model_repository_llm"
    shutil.copytree(LLM_REPOSITORY, llm_repository, ignore=shutil.ignore_patterns("__pycache__"))
    server = triton_server([repository, ENSEMBLES, llm_repository],
                           log_path=root / "tritonserver.log")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENVIRONMENT_VARIABLE, ",".join(f"{p}=0.33" for p in FAULT_POINTS))
        server.start(timeout=120)
    yield server
    server.stop()


@pytest.mark.parametrize("model", ["risk_pipeline", "risk_router"])
def test_every_catch_all_answers_each_request_of_concurrent_batches_and_the_server_survives(
        faulty_server, rows, legacy_scores, model):
    pid = faulty_server.process.pid
    calls = [(("good", i), model, json.dumps({"request_id": f"f-{i}", "features": rows[i]}).encode())
             for i in range(CONCURRENCY)]
    scored = failed = 0
    for ((_, i), *_), (probability, error) in concurrent_rounds(faulty_server.grpc_url, calls):
        if error is None:
            assert probability is None or abs(probability - legacy_scores[i]) <= TOLERANCE
            scored += 1
        else:
            assert error[0] in ("StatusCode.INTERNAL", "StatusCode.UNAVAILABLE"), error
            assert "internal error" in error[1], error
            failed += 1
    assert scored + failed == CONCURRENCY * ROUNDS
    assert failed > 0, "no fault fired: the catch-all paths were not exercised"
    assert_same_server_serving(faulty_server, pid, faulty_server.grpc_url)


def test_risk_streams_catch_all_answers_every_request_and_the_server_survives(faulty_server, rows):
    """Batches fail at risk_stream's catch-all and at its scoring model's; timer rounds fail too, and the next
    round still gives up the ids the failed requests left missing."""
    pid = faulty_server.process.pid
    records = [{"features": r} for r in rows[:8]]
    results, _, _ = stream_client.replay(faulty_server.grpc_url, records * 4, 8, shuffle=0.3, window=4,
                                         timeout_s=60)
    assert all(r.complete for r in results), [r.finals for r in results]
    errors = [e for r in results for e in r.errors]
    # The catch-alls answer; a request may also meet another clear error on the way (its scoring model's queue
    # timeout on a loaded machine), which is an answer too: every request's final response came (above).
    assert any("internal error" in e for e in errors), errors[:5]
    assert all(e.strip() for e in errors), errors
    assert_same_server_serving(faulty_server, pid, faulty_server.grpc_url)


LLM_ROUNDS = 6


def test_the_language_models_catch_all_refuses_a_request_alone_while_concurrent_ones_are_answered(faulty_server,
                                                                                                  rows):
    """llm and risk_explainer fail a third of their requests at their catch-all: each such request gets its own
    INTERNAL answer, a bad one its own field error, the others their streams, every request its final answer."""
    pid = faulty_server.process.pid
    calls = ([("llm", {"text_input": f"Name {n} colours.", "max_tokens": 2}) for n in range(6)]
             + [("llm", {"text_input": "", "max_tokens": 2})]
             + [("risk_explainer", {"payload": json.dumps({"features": rows[n]})}) for n in range(4)])
    seen = {"llm": set(), "risk_explainer": set()}
    with ThreadPoolExecutor(len(calls)) as pool:
        for _ in range(LLM_ROUNDS):
            results = list(pool.map(lambda call: generate_stream(faulty_server.http_url, call[1], call[0],
                                                                 timeout=120), calls))
            for (model, body), result in zip(calls, results):
                if result.error is None:
                    # The final event: llm's counts, or the explainer's source of the words (model or template).
                    assert "output_tokens" in result.final or "source" in result.final, result.events
                    assert body.get("text_input") != "", "an empty prompt was answered"
                    seen[model].add("answered")
                elif f"{model}: internal error" in result.error:
                    seen[model].add("caught")
                else:
                    # A request's own error, or (for the explainer) its scoring model's catch-all on the way.
                    assert ("text_input: empty prompt" in result.error if model == "llm"
                            else "internal error" in result.error), (model, body, result.error)
            if all(s >= {"answered", "caught"} for s in seen.values()):
                break
    assert seen == {"llm": {"answered", "caught"}, "risk_explainer": {"answered", "caught"}}
    assert_same_server_serving(faulty_server, pid, faulty_server.grpc_url)

