"""risk_explainer on the real server: reason codes, the streamed explanation, the forced light path, bad records,
and answers in time when the language model dies."""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from s2t.backends.llm.explanation_text import template_explanation
from s2t.backends.scoring.reason_codes import LinearReasons
from s2t.backends.records.record_decoder import RecordDecoder, parse_record
from s2t.clients.llm_client import generate_stream
from s2t.serve.supervisor import stubs_of
from tests.conftest import MODEL_REPOSITORY, ROOT
from tests.integration.conftest import _llm_repository_for_tests
from tests.integration.servers import wait_ready
from tests.integration.servers import repository_copies, serving, triton_server


RECORD = json.loads((ROOT / "clients" / "examples" / "record.json").read_text())


def body(record) -> dict:
    return {"payload": json.dumps(record)}


@pytest.fixture(scope="module")
def local_reasons():
    versions = sorted(int(p.name) for p in (MODEL_REPOSITORY / "risk_scorer_lite").iterdir() if p.name.isdigit())
    return LinearReasons(MODEL_REPOSITORY / "risk_scorer_lite" / str(versions[-1]) / "model.onnx")


def pipeline_score(url: str, record) -> tuple[float, str]:
    request = {"inputs": [{"name": "payload", "datatype": "BYTES", "shape": [1, 1], "data": [json.dumps(record)]}]}
    with urllib.request.urlopen(urllib.request.Request(f"http://{url}/v2/models/risk_pipeline/infer",
                                                       data=json.dumps(request).encode()), timeout=30) as response:
        outputs = {o["name"]: o["data"][0] for o in json.loads(response.read())["outputs"]}
    return outputs["probability"], outputs["decision"]


def as_list(value):
    return value if isinstance(value, list) else [value]


def test_reason_codes_add_up_to_the_lite_models_probability(local_reasons, triton_llm):
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    explanation = local_reasons.explain(decoded.categorical, decoded.numeric)[0]
    import onnxruntime as ort
    session = ort.InferenceSession(str(local_reasons_path(local_reasons)))
    lite = session.run(None, {"categorical": decoded.categorical, "numeric": decoded.numeric})[0].ravel()[0]
    assert explanation.probability == pytest.approx(float(lite), abs=1e-6)
    assert 1 <= len(explanation.reasons) <= 3
    assert [r.points for r in explanation.reasons] == sorted((r.points for r in explanation.reasons), reverse=True)


def local_reasons_path(reasons: LinearReasons):
    versions = sorted(int(p.name) for p in (MODEL_REPOSITORY / "risk_scorer_lite").iterdir() if p.name.isdigit())
    return MODEL_REPOSITORY / "risk_scorer_lite" / str(versions[-1]) / "model.onnx"


def test_the_explainer_streams_reason_codes_first_then_the_language_models_words(triton_llm, local_reasons):
    result = generate_stream(triton_llm.http_url, body(RECORD), model="risk_explainer")
    assert result.error is None
    head = result.events[0][1]
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    expected = [r.code() for r in local_reasons.explain(decoded.categorical, decoded.numeric)[0].reasons]
    assert as_list(head["reasons"]) == expected
    probability, decision = pipeline_score(triton_llm.http_url, RECORD)
    assert head["decision"] == decision
    assert head["probability"] == pytest.approx(probability)
    words = [e["text_output"] for _, e in result.events[1:] if e.get("text_output")]
    assert len(words) > 3, "the explanation is streamed token by token"
    assert result.final["source"] == "llm"


def test_a_threshold_near_zero_forces_the_template_and_counts_the_degrade(triton_llm, local_reasons):
    results = [generate_stream(triton_llm.http_url, body(RECORD), model="risk_explainer_light") for _ in range(2)]
    record = parse_record(json.dumps(RECORD).encode())
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    reasons = local_reasons.explain(decoded.categorical, decoded.numeric)[0].reasons
    for result in results:
        assert result.error is None
        head = result.events[0][1]
        expected = template_explanation(head["decision"], head["probability"], reasons, record.features)
        assert result.final["source"] == "template"
        assert result.final["text_output"] == expected
    with urllib.request.urlopen(f"http://localhost:{triton_llm.metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    degraded = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("s2t_explainer_degraded_total") and 'model="risk_explainer_light"' in line)
    assert degraded >= 2


def bad(record_change) -> dict:
    record = json.loads(json.dumps(RECORD))
    record_change(record)
    return body(record)


BAD_RECORDS = [
    (bad(lambda r: r["features"].pop("credit_amount")), "features.credit_amount: missing"),
    (bad(lambda r: r["features"].update(duration_in_month="long")), "features.duration_in_month: expected a number"),
    ({"payload": "{not json"}, "payload"),
    ({"payload": ""}, "payload"),
]


def test_bad_records_get_their_own_error_while_concurrent_good_ones_are_explained(triton_llm):
    with ThreadPoolExecutor(len(BAD_RECORDS) + 2) as pool:
        bad_futures = [pool.submit(generate_stream, triton_llm.http_url, b, "risk_explainer_light")
                       for b, _ in BAD_RECORDS]
        good_futures = [pool.submit(generate_stream, triton_llm.http_url, body(RECORD), "risk_explainer_light")
                        for _ in range(2)]
        for (request, message), future in zip(BAD_RECORDS, bad_futures):
            result = future.result()
            assert result.error is not None and message in result.error, (request, result.error)
            assert result.status == 400
        for future in good_futures:
            assert future.result().error is None and future.result().final["source"] == "template"
    assert np.isfinite(pipeline_score(triton_llm.http_url, RECORD)[0])


# A stream mid-generation waits at most token_timeout_s for its next word; a new request at most degrade_ttft_s for
# its first; both then answer (the template, or an error after words already sent). Margin for a busy machine.
KILL_TTFT_S, KILL_TOKEN_S = 10, 3
ANSWER_DEADLINE_S = KILL_TTFT_S + KILL_TOKEN_S + 20


# Triton 2.51's python backend aborts the whole server (this text in its log) when a stub is killed while it holds
# its shared-memory lock, which it does for microseconds per message. `s2t serve` starts an aborted server again
# (tests/integration/serve/test_lifecycle.py); a run the server did not survive says nothing of the explainer.
SERVER_ABORT = "boost::interprocess::lock_exception"
KILL_TRIES = 3


def supervised_llm(tmp: Path):
    """The risk and LLM repositories on a server (not started) whose supervisor reloads a model whose stub died."""
    repository, ensembles = repository_copies(tmp)
    llm_repository = _llm_repository_for_tests(tmp / "model_repository_llm")
    config = llm_repository / "risk_explainer" / "config.pbtxt"
    text = config.read_text()
    for key, value in (("degrade_ttft_s", KILL_TTFT_S), ("token_timeout_s", KILL_TOKEN_S)):
        text, count = re.subn(rf'(key: "{key}"\s*value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert count == 1, key
    config.write_text(text)
    return triton_server([repository, ensembles, llm_repository], log_path=tmp / "tritonserver.log",
                         supervise=True, exit_timeout_seconds=10)


def aborted(server) -> bool:
    """Whether the server died of the python backend's abort (given a few seconds to finish dying)."""
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        return False
    return SERVER_ABORT in Path(server.log_path).read_text(errors="replace")


def explain_timed(url: str, started=None) -> tuple[dict, float]:
    """One explanation over generate_stream: (its events, error included, and when it ended). `started` is released
    at the language model's first word."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=ANSWER_DEADLINE_S + 60)
    events = []
    try:
        connection.request("POST", "/v2/models/risk_explainer/generate_stream", json.dumps(body(RECORD)),
                           {"Content-Type": "application/json"})
        for line in connection.getresponse():
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
                if started is not None and sum(bool(e.get("text_output")) for e in events) == 1:
                    started.release()
                if "error" in events[-1] or "source" in events[-1]:
                    break
    finally:
        connection.close()
    return events, time.monotonic()


def test_explainer_streams_and_new_requests_answer_when_the_language_model_dies_mid_generation(built_artifacts,
                                                                                              tmp_path):
    for attempt in range(KILL_TRIES):
        with serving(supervised_llm(tmp_path / f"try{attempt}")) as server:
            try:
                streams_and_new_requests_answer_when_the_language_model_dies(server)
                return
            except Exception:
                if not aborted(server):
                    raise
            print(f"tritonserver aborted ({SERVER_ABORT}) when the llm stub was killed; starting it again")
    pytest.fail(f"tritonserver aborted ({SERVER_ABORT}) on each of {KILL_TRIES} kills of the llm stub")


def streams_and_new_requests_answer_when_the_language_model_dies(server):
    url, streams, started = server.http_url, 4, threading.Semaphore(0)
    with ThreadPoolExecutor(streams + 10) as pool:
        running = [pool.submit(explain_timed, url, started) for _ in range(streams)]
        for _ in range(streams):
            assert started.acquire(timeout=120), "every stream reaches the language model's words"
        victim = next(s for s in stubs_of(server.process.pid).values() if s.model == "llm")
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        fresh = [pool.submit(explain_timed, url) for _ in range(10)]
        answers = [f.result() for f in running + fresh]
    for events, ended in answers:
        # The score and the reasons first, then the model's words, the template or a clear error, all in time.
        assert "reasons" in events[0] and "probability" in events[0], events[0]
        final = events[-1]
        assert final.get("source") in ("llm", "template") or "language model" in final.get("error", ""), final
        assert ended - killed < ANSWER_DEADLINE_S, f"answered {ended - killed:.1f} s after the kill"
    # Once the supervisor has reloaded `llm`, explanations come from the model again (probed within the interval).
    deadline = time.monotonic() + 2 * ANSWER_DEADLINE_S
    while True:
        events, _ = explain_timed(url)
        assert "reasons" in events[0] and "error" not in events[-1], events[-1]
        if events[-1]["source"] == "llm" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert events[-1]["source"] == "llm"


# Explanations sent during a 50% canary of llm; at 50% all of them from one version has a chance of 2 ** -11.
CANARY_EXPLANATIONS = 12


def llm_generations(url: str) -> dict[str, int]:
    """Requests each loaded version of `llm` has answered so far (Triton's own statistics)."""
    with urllib.request.urlopen(f"http://{url}/v2/models/llm/stats", timeout=30) as response:
        stats = json.loads(response.read())["model_stats"]
    return {s["version"]: s["inference_stats"]["success"]["count"] for s in stats}


def generations_since(url: str, before: dict[str, int], timeout_s: float = 10) -> dict[str, int]:
    """Requests per version of `llm` since `before`, once every version has some (bounded): Triton counts a
    decoupled request only some time after its last response has gone out."""
    deadline = time.monotonic() + timeout_s
    while True:
        served = {version: count - before.get(version, 0) for version, count in llm_generations(url).items()}
        if all(served.values()) or time.monotonic() > deadline:
            return served
        time.sleep(0.2)


def test_explanations_follow_a_canary_of_the_language_model_to_both_versions(triton_llm):
    from s2t.backends.llm.engine import packaged_model_path
    from tests.integration.llm.test_llm_rollout import s2t

    repo = triton_llm.repositories[-1]
    staged, _ = s2t(triton_llm, repo, "publish", "llm", str(packaged_model_path()), "--stage")
    try:
        split, _ = s2t(triton_llm, repo, "canary", "llm", str(staged["version"]), "--percent", "50")
        assert split["split"] == f"50% llm:1, 50% llm:{staged['version']}"
        before = llm_generations(triton_llm.http_url)
        # Valid explanations beside a client that sends broken records: each answered on its own.
        with ThreadPoolExecutor(5) as pool:
            good = [pool.submit(generate_stream, triton_llm.http_url, body(RECORD), "risk_explainer", 300)
                    for _ in range(CANARY_EXPLANATIONS)]
            broken = [pool.submit(generate_stream, triton_llm.http_url, b, "risk_explainer", 300)
                      for b, _ in BAD_RECORDS]
            results = [f.result() for f in good]
            refused = [(f.result(), message) for f, (_, message) in zip(broken, BAD_RECORDS)]
        served = generations_since(triton_llm.http_url, before)
    finally:
        s2t(triton_llm, repo, "canary", "llm", "--off")
        # The staged version unloads after the canary: the session's server is left ready for the next module.
        wait_ready(triton_llm)
    assert [r.error for r in results] == [None] * CANARY_EXPLANATIONS
    assert {r.final["source"] for r in results} == {"llm"}
    for result, message in refused:
        assert result.status == 400 and message in (result.error or ""), result.error
    assert served["1"] > 0 and served[str(staged["version"])] > 0, served
