"""risk_pipeline as one python model: the scorer it runs is configuration, and a missing scorer is refused."""
import json
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpc

from tests.conftest import MODEL_REPOSITORY
from s2t.serve.triton_server import ServerError
from tests.integration.servers import triton_server
from tests.integration.traffic import PACE_S

PIPELINE_MODELS = ("risk_pipeline", "risk_scorer")


def pipeline_repository(root, scorer_version: str):
    """risk_pipeline with risk_scorer version 1 (the German Credit model) and 2 (the logistic fallback's file)."""
    repo = root / "model_repository"
    for name in PIPELINE_MODELS:
        shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for version in [p for p in (repo / "risk_scorer").iterdir() if p.name.isdigit()]:
        shutil.rmtree(version)
    shutil.copytree(MODEL_REPOSITORY / "risk_scorer" / "1", repo / "risk_scorer" / "1")
    shutil.copytree(MODEL_REPOSITORY / "risk_scorer_lite" / "1", repo / "risk_scorer" / "2")
    set_scorer_version(repo, scorer_version)
    return repo


def set_scorer_version(repo, version: str) -> None:
    """What `s2t publish` / `promote` / `rollback` do to risk_pipeline: rewrite the one parameter."""
    config = repo / "risk_pipeline" / "config.pbtxt"
    text = config.read_text()
    start = text.index('key: "scorer_version"')
    value = text.index("string_value:", start)
    end = text.index("}", value)
    config.write_text(text[:value] + f'string_value: "{version}" ' + text[end:])


def score(client, payloads):
    tensor = grpc.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[p] for p in payloads], dtype=object))
    return client.infer("risk_pipeline", [tensor]).as_numpy("probability").ravel()


def reference(onnx_path, feature_spec, data):
    import onnxruntime as ort

    from s2t.backends.records.record_decoder import encode_columns
    categorical, numeric = encode_columns(feature_spec, data.columns)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"categorical": categorical, "numeric": numeric})[0].ravel()


def test_rewriting_scorer_version_switches_the_scorer_live_without_a_failed_request(built_artifacts, tmp_path,
                                                                                     german_credit_data, feature_spec):
    repo = pipeline_repository(tmp_path, "1")
    rows = german_credit_data.take(np.arange(32))
    payloads = [json.dumps({"features": r}).encode() for r in rows.records()]
    expected = {v: reference(repo / "risk_scorer" / str(v) / "model.onnx", feature_spec, rows) for v in (1, 2)}
    assert np.max(np.abs(expected[1] - expected[2])) > 1e-3, "the two versions must be told apart"
    server = triton_server([repo],
                           log_path=tmp_path / "triton.log")
    with server:
        client = grpc.InferenceServerClient(server.grpc_url)
        np.testing.assert_allclose(score(client, payloads), expected[1], atol=1e-6)
        failures, answers, stop = [], [], threading.Event()

        def load():
            own = grpc.InferenceServerClient(server.grpc_url)
            while not stop.wait(PACE_S):
                try:
                    answers.append(score(own, payloads[:1])[0])
                except Exception as err:  # noqa: BLE001 - every failure counts
                    failures.append(str(err))
            own.close()

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            set_scorer_version(repo, "2")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if abs(score(client, payloads[:1])[0] - expected[2][0]) <= 1e-6:
                    break
                time.sleep(0.2)
            time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        np.testing.assert_allclose(score(client, payloads), expected[2], atol=1e-6)
        client.close()
    assert failures == []
    # While the new instance loaded, the old one kept answering with version 1.
    assert len(answers) > 10 and {round(float(a), 6) for a in answers} <= \
        {round(float(expected[1][0]), 6), round(float(expected[2][0]), 6)}


def test_a_scorer_version_that_does_not_exist_is_refused_with_its_path(built_artifacts, tmp_path):
    repo = pipeline_repository(tmp_path, "9")
    log = tmp_path / "triton.log"
    with pytest.raises(ServerError):
        triton_server([repo], log_path=log).start(60)
    assert f"scorer 'risk_scorer' version 9: {repo.resolve()}/risk_scorer/9/model.onnx does not exist" \
        in log.read_text()
