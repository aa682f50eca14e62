"""risk_pipeline on the in-process backend (native/python_inprocess.cc) against the real server: each request of a
dynamic batch answered on its own under concurrency (a bad record, a bad row of a multi-row request, a BYTES buffer
that does not parse and an internal failure fail their own requests only), only the outputs a request asks for, HTTP
and gRPC, binary and JSON tensors, no stub process, the scores the python backend's model gives, and statistics that
tell the caller's errors from the model's."""
from __future__ import annotations

import http.client
import json
import shutil
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from s2t.backends.runtime import fault_points
from s2t.prometheus_text import samples_named, scrape
from s2t.serve.supervisor import stubs_of
from s2t.triton_admin import TritonAdmin
from tests.conftest import MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

MODELS = ("risk_pipeline", "risk_scorer")


@pytest.fixture(scope="module")
def server(tmp_path_factory, built_artifacts):
    root = tmp_path_factory.mktemp("inprocess")
    repo = root / "model_repository"
    for name in MODELS:
        shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    with serving(triton_server([repo], root / "triton.log", model_control_mode="explicit")) as running:
        yield running


def records(german_credit_data, n: int) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in german_credit_data.take(np.arange(n)).records()]


def http_infer(url: str, payloads: list[bytes], outputs=None, binary: bool = True):
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object), binary_data=binary)
    requested = None if outputs is None else [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
    return client.infer("risk_pipeline", [tensor], outputs=requested)


def fused_scores(payloads: list[bytes]):
    """The fused pipeline run directly on `payloads`, as risk_pipeline's config sets it up."""
    from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.triton_config import backend_parameters, load

    settings = read_parameters(PipelineSettings, backend_parameters(load(MODEL_REPOSITORY / "risk_pipeline")))
    return warm_pipeline(MODEL_REPOSITORY, settings, "risk_pipeline").score(payloads)


def binary_call(port: int, raw: bytes, rows: int = 1) -> tuple[int, float | str]:
    """`raw` sent as risk_pipeline's `payload` ([rows, 1] BYTES) with the HTTP binary-data extension, byte for byte
    as given: (200, the probability of the first row) or (status, the error message)."""
    header = json.dumps({
        "inputs": [{"name": "payload", "shape": [rows, 1], "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "probability", "parameters": {"binary_data": True}}]}).encode()
    connection = http.client.HTTPConnection("localhost", port, timeout=60)
    try:
        connection.request("POST", "/v2/models/risk_pipeline/infer", header + raw,
                           {"Inference-Header-Content-Length": str(len(header))})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return response.status, json.loads(body)["error"]
        json_size = int(response.getheader("Inference-Header-Content-Length"))
        return 200, float(np.frombuffer(body[json_size:json_size + 4], dtype=np.float32)[0])
    finally:
        connection.close()


def element(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data


# Buffers a caller can send with the binary-data extension for a BYTES `payload` of `rows` rows, and what the caller
# is told. Triton 2.51 refuses a buffer with too few or too many length prefixes itself; one whose element's length
# runs past its end it hands to the backend as it is.
MALFORMED = [
    (struct.pack("<I", 0xFFFFFFFF) + b"x" * 16, 1,
     "payload: element 0's length 4294967295 runs past the end of the 20-byte buffer"),
    (element(b"{}") + struct.pack("<I", 100) + b"ab", 2,
     "payload: element 1's length 100 runs past the end of the 12-byte buffer"),
]


def test_a_bytes_buffer_that_does_not_parse_fails_its_own_request_alone_and_its_batch_mates_are_scored(
        server, german_credit_data):
    """Each round: one malformed buffer beside six valid records, sent at once, so that they share batches."""
    good = records(german_credit_data, 6)
    expected = fused_scores(good).probability.ravel()
    port = int(server.http_url.rsplit(":", 1)[1])
    pid = server.process.pid
    rounds = 60
    with ThreadPoolExecutor(7) as pool:
        for r in range(rounds):
            bad, rows, reason = MALFORMED[r % len(MALFORMED)]
            calls = [(bad, rows)] + [(element(g), 1) for g in good]
            answers = list(pool.map(lambda call: binary_call(port, *call), calls))
            assert answers[0] == (400, reason)
            for i, (status, probability) in enumerate(answers[1:]):
                assert status == 200, (r, i, probability)
                assert probability == expected[i]
    assert server.process.poll() is None and server.process.pid == pid
    stats = TritonAdmin(server.http_url).model_stats("risk_pipeline")[0]
    assert stats["inference_count"] > stats["execution_count"], "7 callers at once form batches"


def _counters_now(metrics_port: int) -> dict[str, float]:
    metrics = scrape(f"http://localhost:{metrics_port}/metrics")
    counters = {}
    for name, key in (("nv_inference_request_success", None), ("nv_inference_request_failure", "reason"),
                      ("s2t_request_errors_total", "kind")):
        for labels, value in samples_named(metrics, name):
            if labels.get("model") == "risk_pipeline":
                counters[name + (f"/{labels[key]}" if key else "")] = value
    return counters


def request_counters(metrics_port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """risk_pipeline's answered requests as Triton counts them (successes, failures by reason) and as the backend
    counts its errors (by kind), once two reads 0.25 s apart agree: Triton counts a request after its answer is
    sent, so a read right after the last answers can miss the last of them."""
    deadline, previous = time.monotonic() + timeout_s, None
    while True:
        counters = _counters_now(metrics_port)
        if counters == previous or time.monotonic() > deadline:
            return counters
        previous = counters
        time.sleep(0.25)


def counted_since(before: dict, after: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_invalid_records_count_as_the_callers_errors_not_as_the_models_failures(server, german_credit_data):
    """A fifth of the requests are invalid (records the decoder refuses, buffers that do not parse): Triton counts
    every request answered, none as a BACKEND failure, and the backend's own counter counts exactly the invalid."""
    good = records(german_credit_data, 8)
    expected = fused_scores(good).probability.ravel()
    port = int(server.http_url.rsplit(":", 1)[1])
    invalid = [element(b'{"features": {"duration_in_month": "twelve"}}'), element(b"{not json"), MALFORMED[0][0]]
    calls = [(None, invalid[(i // 5) % 3]) if i % 5 == 4 else (i % 8, element(good[i % 8])) for i in range(400)]
    before = request_counters(server.metrics_port)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda call: binary_call(port, call[1]), calls))
    after = request_counters(server.metrics_port)
    for (row, _), (status, answer) in zip(calls, answers):
        if row is None:
            assert status == 400, answer
        else:
            assert (status, answer) == (200, expected[row])
    assert counted_since(before, after, "nv_inference_request_failure/BACKEND") == 0
    assert counted_since(before, after, "nv_inference_request_success") == len(calls)
    assert counted_since(before, after, "s2t_request_errors_total/caller") == len(calls) // 5
    assert counted_since(before, after, "s2t_request_errors_total/model") == 0


def test_the_model_runs_in_the_server_process_with_no_stub(server):
    assert not [s for s in stubs_of(server.process.pid).values() if s.model == "risk_pipeline"]
    assert TritonAdmin(server.http_url).model_config("risk_pipeline")["backend"] == "s2t_inprocess"


def test_scores_equal_the_fused_pipeline_run_directly_over_http_and_grpc(server, german_credit_data):
    from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.triton_config import backend_parameters, load

    settings = read_parameters(PipelineSettings, backend_parameters(load(MODEL_REPOSITORY / "risk_pipeline")))
    payloads = records(german_credit_data, 64)
    direct = warm_pipeline(MODEL_REPOSITORY, settings, "risk_pipeline").score(payloads)
    over_http = http_infer(server.http_url, payloads)
    assert np.array_equal(over_http.as_numpy("probability").ravel(), direct.probability.ravel())
    assert over_http.as_numpy("decision").ravel().tolist() == direct.decision.ravel().tolist()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object))
    over_grpc = client.infer("risk_pipeline", [tensor])
    assert np.array_equal(over_grpc.as_numpy("probability").ravel(), direct.probability.ravel())
    as_json = http_infer(server.http_url, payloads[:3], binary=False)
    assert np.allclose(as_json.as_numpy("probability").ravel(), direct.probability.ravel()[:3], atol=1e-6)


def test_a_request_gets_only_the_outputs_it_asks_for(server, german_credit_data):
    answer = http_infer(server.http_url, records(german_credit_data, 2), outputs=["decision"])
    assert answer.as_numpy("probability") is None
    assert answer.as_numpy("decision").shape == (2, 1)


def test_under_concurrency_each_bad_request_fails_alone_and_every_good_one_is_answered(server, german_credit_data):
    good = records(german_credit_data, 16)
    bad_record = b'{"features": {"duration_in_month": "twelve"}}'
    calls = []
    for i in range(240):
        if i % 4 == 1:
            calls.append(("bad", [bad_record]))
        elif i % 4 == 2:
            calls.append(("bad_row", [good[i % 16], b"{not json"]))
        else:
            calls.append(("good", [good[i % 16]] * (1 + i % 3)))

    def call(kind_and_payloads):
        kind, payloads = kind_and_payloads
        try:
            answer = http_infer(server.http_url, payloads)
            return kind, answer.as_numpy("probability").shape, None
        except InferenceServerException as err:
            return kind, None, err

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, calls))
    for (kind, payloads), (_, shape, err) in zip(calls, results):
        if kind == "good":
            assert err is None and shape == (len(payloads), 1)
        elif kind == "bad":
            assert err is not None and "400" in str(err.status())
            assert err.message().startswith("features.")
        else:
            assert err is not None and err.message().startswith("record 1: payload: not valid JSON")
    stats = TritonAdmin(server.http_url).model_stats("risk_pipeline")[0]
    assert stats["inference_count"] > stats["execution_count"], "16 callers at once form batches"


def test_an_internal_failure_fails_its_own_batch_alone_and_counts_as_the_models_failure(tmp_path, german_credit_data,
                                                                                        monkeypatch):
    """A third of the batches raise (the fault point): their requests are answered INTERNAL without the details and
    counted as BACKEND failures and the model's errors; every other request, invalid ones beside them, is answered
    as ever, and the server keeps serving."""
    repo = tmp_path / "model_repository"
    for name in MODELS:
        shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv(fault_points.ENVIRONMENT_VARIABLE, "risk_pipeline.execute=0.3")
    payloads = records(german_credit_data, 4)
    expected = fused_scores(payloads).probability.ravel()
    with serving(triton_server([repo], tmp_path / "triton.log", model_control_mode="explicit")) as running:
        port = int(running.http_url.rsplit(":", 1)[1])
        pid = running.process.pid

        def call(i):
            if i % 5 == 4:
                return None, binary_call(port, MALFORMED[0][0])
            rows = 1 + i % 4
            raw = b"".join(element(p) for p in payloads[:rows])
            return rows, binary_call(port, raw, rows)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, range(300)))
        counters = request_counters(running.metrics_port)
        failed = [answer for rows, (status, answer) in answers if status == 500]
        assert 0 < len(failed) < len(answers)
        assert set(failed) == {"risk_pipeline: internal error"}
        for rows, (status, answer) in answers:
            if rows is None:
                assert status == 400, answer
            elif status == 200:
                assert answer == expected[0]
        assert counters.get("nv_inference_request_failure/BACKEND") == len(failed)
        assert counters.get("s2t_request_errors_total/model") == len(failed)
        assert counters.get("s2t_request_errors_total/caller") == len(answers) // 5
        assert "Traceback" in (tmp_path / "triton.log").read_text()
        assert running.process.poll() is None and running.process.pid == pid
