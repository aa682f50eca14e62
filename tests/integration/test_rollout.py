"""Publishes and rollbacks on a live server under constant load: no failed request, the ensemble always ready."""
import json
import shutil
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpc

from backends.record_decoder import encode_columns
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from tools.live_control import apply
from tools.publish import ParityGate, publish
from tools.rollback import rollback
from tools.triton_server import TritonServer
from tools.version_store import VersionStore

KEY = "rollout-key"
SWAPS = 5  # publish + rollback each: ten changes in a row


@pytest.fixture(params=["poll", "explicit"])
def live(request, built_artifacts, tmp_path):
    """A server on a private copy of the repository, so that versions can come and go."""
    repo = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonServer([repo, ENSEMBLES], free_port(), free_port(), free_port(), model_control_mode=request.param,
                          admin_key=KEY if request.param == "explicit" else None, exit_timeout_seconds=5,
                          log_path=tmp_path / "triton.log")
    with server:
        yield server, repo


class Load:
    """Constant traffic on risk_pipeline (records) and risk_scorer (packed tensors), counting every failure."""

    def __init__(self, url, records, categorical, numeric):
        self.url, self.records, self.categorical, self.numeric = url, records, categorical, numeric
        self.stop = threading.Event()
        self.failures, self.answers, self.versions, self.not_ready = [], 0, set(), 0
        self.threads = [threading.Thread(target=self._pipeline), threading.Thread(target=self._scorer),
                        threading.Thread(target=self._watch)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _loop(self, send):
        client = grpc.InferenceServerClient(self.url)
        i = 0
        while not self.stop.is_set():
            try:
                send(client, i % len(self.records))
                self.answers += 1
            except Exception as err:  # noqa: BLE001 - every failure counts
                self.failures.append(str(err))
            i += 1
        client.close()

    def _pipeline(self):
        def send(client, i):
            payload = grpc.InferInput("payload", [1, 1], "BYTES")
            payload.set_data_from_numpy(np.array([[self.records[i]]], dtype=object))
            client.infer("risk_pipeline", [payload])
        self._loop(send)

    def _scorer(self):
        def send(client, i):
            a, b = grpc.InferInput("categorical", [1, 13], "INT64"), grpc.InferInput("numeric", [1, 7], "FP32")
            a.set_data_from_numpy(self.categorical[i:i + 1])
            b.set_data_from_numpy(self.numeric[i:i + 1])
            self.versions.add(int(client.infer("risk_scorer", [a, b]).get_response().model_version))
        self._loop(send)

    def _watch(self):
        client = grpc.InferenceServerClient(self.url)
        while not self.stop.is_set():
            if not client.is_model_ready("risk_pipeline"):
                self.not_ready += 1
            time.sleep(0.01)
        client.close()


def test_ten_publishes_and_rollbacks_under_load_fail_no_request(live, built_artifacts, german_credit_data,
                                                                feature_spec):
    server, repo = live
    rows = german_credit_data.take(np.arange(40))
    categorical, numeric = encode_columns(feature_spec, rows.columns)
    records = [json.dumps({"features": r}).encode() for r in rows.records()]
    gate = ParityGate(built_artifacts["saved_model"], built_artifacts["data"])
    client = grpc.InferenceServerClient(server.grpc_url)
    rollback_seconds = []
    with Load(server.grpc_url, records, categorical, numeric) as load:
        time.sleep(1)
        for _ in range(SWAPS):
            version = publish("risk_scorer", built_artifacts["onnx"], repo, gate)
            apply(server.http_url, "risk_scorer", version, key=KEY)
            # The previous version is still loaded: rolling back to it loads nothing.
            previous = VersionStore(repo).served("risk_scorer")[-2]
            assert client.is_model_ready("risk_scorer", str(previous))
            done = rollback("risk_scorer", repo)
            rollback_seconds.append(apply(server.http_url, "risk_scorer", done.serving, key=KEY))
            assert done.serving == 1
        time.sleep(0.5)
    client.close()
    print(f"rollback visible after {', '.join(f'{s * 1000:.0f}' for s in rollback_seconds)} ms; "
          f"{load.answers} answers")
    assert load.failures == []
    assert load.not_ready == 0
    assert load.answers > 100
    assert load.versions == set(range(1, SWAPS + 2))
    history = VersionStore(repo).history("risk_scorer")
    assert [e["action"] for e in history] == ["publish", "rollback"] * SWAPS
    assert all(e["parity"]["rows"] == 1000 for e in history if e["action"] == "publish")
    assert {(e["from"], e["to"]) for e in history if e["action"] == "rollback"} == \
        {(v, 1) for v in range(2, SWAPS + 2)}
