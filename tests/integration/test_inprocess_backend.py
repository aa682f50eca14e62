"""risk_pipeline on the in-process backend (native/python_inprocess.cc) against the real server: each request of a
dynamic batch answered on its own under concurrency (a bad record, a bad row of a multi-row request and an internal
failure fail their own requests only), only the outputs a request asks for, HTTP and gRPC, binary and JSON tensors,
no stub process, and the scores the python backend's model gives."""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from backends import fault_points
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


def test_the_model_runs_in_the_server_process_with_no_stub(server):
    assert not [s for s in stubs_of(server.process.pid).values() if s.model == "risk_pipeline"]
    assert TritonAdmin(server.http_url).model_config("risk_pipeline")["backend"] == "s2t_inprocess"


def test_scores_equal_the_fused_pipeline_run_directly_over_http_and_grpc(server, german_credit_data):
    from backends.fused_pipeline import PipelineSettings, warm_pipeline
    from backends.model_parameters import read_parameters
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


def test_an_internal_failure_answers_each_request_internal_and_the_server_keeps_serving(tmp_path, german_credit_data,
                                                                                      monkeypatch):
    repo = tmp_path / "model_repository"
    for name in MODELS:
        shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv(fault_points.ENVIRONMENT_VARIABLE, "risk_pipeline.execute=0.5")
    payloads = records(german_credit_data, 4)
    with serving(triton_server([repo], tmp_path / "triton.log", model_control_mode="explicit")) as running:
        def call(i):
            try:
                http_infer(running.http_url, payloads[: 1 + i % 4])
                return None
            except InferenceServerException as err:
                return err
        with ThreadPoolExecutor(8) as pool:
            errors = list(pool.map(call, range(200)))
        failed = [e for e in errors if e is not None]
        assert failed and len(failed) < len(errors)
        assert {e.message() for e in failed} == {"risk_pipeline: internal error"}
        assert "Traceback" in (tmp_path / "triton.log").read_text()
