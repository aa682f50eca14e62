"""`s2t canary --auto` on a live server under load: an identical candidate is promoted, a candidate whose scores
are shifted by +0.05 is rolled back at its first step with the reason."""
import json
import os
import subprocess
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpc

from tests.conftest import S2T
from tests.integration.servers import repository_copies, triton_server
from tests.samples import SHIFT, shifted_model
from tests.integration.traffic import PACE_S
from s2t.control.live_control import ADMIN_KEY_ENV
from s2t.control.version_store import VersionStore
from s2t.errors import GATE_REFUSED

KEY = "analysis-key"


@pytest.fixture(scope="module")
def live(built_artifacts, tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis")
    repo, ensembles = repository_copies(root)
    server = triton_server([repo, ensembles], model_control_mode="explicit",
                           admin_key=KEY, log_path=root / "triton.log")
    with server:
        yield server, repo


class RouterTraffic:
    """Distinct request_ids through risk_router, a few records per request, without pause."""

    def __init__(self, url, rows):
        self.url, self.rows, self.stop, self.failures = url, rows, threading.Event(), []
        self.thread = threading.Thread(target=self._loop)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)

    def _loop(self):
        client, i = grpc.InferenceServerClient(self.url), 0
        while not self.stop.wait(PACE_S):
            batch = np.array([[json.dumps({"request_id": f"auto-{i + k}", "features": self.rows[(i + k) % len(self.rows)]})
                               .encode()] for k in range(4)], dtype=object)
            tensor = grpc.InferInput("payload", list(batch.shape), "BYTES")
            tensor.set_data_from_numpy(batch)
            try:
                client.infer("risk_router", [tensor])
            except Exception as err:  # noqa: BLE001 - every failure counts
                self.failures.append(str(err))
            i += 4
        client.close()


def auto(server, repo, artifacts, artifact, *extra):
    env = {**os.environ, ADMIN_KEY_ENV: KEY}
    common = ["--repository", str(repo), "--http-url", server.http_url]
    staged = subprocess.run([str(S2T), "publish", "risk_scorer", str(artifact), "--stage", *common, "--saved-model",
                             str(artifacts["saved_model"]), "--data", str(artifacts["data"]), "--atol", "0.1"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert staged.returncode == 0, staged.stderr
    version = int(staged.stdout.split()[-1])
    done = subprocess.run([str(S2T), "canary", "risk_scorer", str(version), "--auto", "--steps", "10,50,100",
                           "--interval", "3s", *common, "--metrics-url",
                           f"http://localhost:{server.metrics_port}/metrics", *extra],
                          capture_output=True, text=True, timeout=300, env=env)
    return version, done


def test_auto_canary_rolls_back_a_candidate_whose_scores_are_shifted(live, built_artifacts, german_credit_data,
                                                                      tmp_path):
    server, repo = live
    primary = VersionStore(repo).served("risk_scorer")[-1]
    shifted = shifted_model(built_artifacts["onnx"], tmp_path / "shifted.onnx", SHIFT)
    with RouterTraffic(server.grpc_url, german_credit_data.records()) as traffic:
        version, done = auto(server, repo, built_artifacts, shifted, "--json")
    assert done.returncode == GATE_REFUSED, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rolled back (shadow 10%: shadow mean |candidate - primary| 0.0"), done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["version"], outcome["promoted"], outcome["steps"][0]["phase"]) == (version, False, "shadow")
    assert last == f"rolled back ({outcome['reason']})"
    assert traffic.failures == []
    assert version in VersionStore(repo).retired("risk_scorer") or version not in VersionStore(repo).served("risk_scorer")
    history = VersionStore(repo).history("risk_scorer")
    assert [e["verdict"] for e in history if e["action"] == "canary-analysis"][-1] == "rolled back"
    assert '"primary" value: { string_value: "risk_scorer:%d" }' % primary in \
        (repo / "risk_router" / "config.pbtxt").read_text()


def test_auto_canary_promotes_an_identical_candidate(live, built_artifacts, german_credit_data):
    server, repo = live
    with RouterTraffic(server.grpc_url, german_credit_data.records()) as traffic:
        version, done = auto(server, repo, built_artifacts, built_artifacts["onnx"])
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == f"promoted {version}"
    assert [line.split(":")[0] for line in lines[:-1]] == ["shadow 10%", "canary 10%", "canary 50%"]
    assert traffic.failures == []
    assert '"primary" value: { string_value: "risk_scorer:%d" }' % version in \
        (repo / "risk_router" / "config.pbtxt").read_text()
