"""Stage, canary, promote and roll back a scorer on a live server under constant load, through risk_router and
risk_pipeline: the candidate gets no primary traffic until promoted, the canary gets its share, no request fails."""
import json
import math
import os
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpc

from tests.conftest import S2T
from tests.integration.servers import repository_copies, triton_server
from tests.samples import SHIFT, shifted_model
from tests.integration.traffic import PACE_S
from s2t.serve.supervisor import stubs_of
from s2t.control.live_control import ADMIN_KEY_ENV
from s2t.control.version_store import VersionStore

KEY = "staged-rollout-key"



@pytest.fixture(scope="module")
def shifted(built_artifacts, tmp_path_factory):
    return shifted_model(built_artifacts["onnx"], tmp_path_factory.mktemp("shifted") / "shifted.onnx", SHIFT)


@pytest.fixture(params=["explicit", "poll"])
def live(request, built_artifacts, tmp_path):
    """A server on private copies of both repositories: rollout steps rewrite the router's and the pipeline's configs."""
    repo, ensembles = repository_copies(tmp_path)
    explicit = request.param == "explicit"
    server = triton_server([repo, ensembles], model_control_mode=request.param,
                           admin_key=KEY if explicit else None, log_path=tmp_path / "triton.log")
    with server:
        yield server, repo


def s2t(server, repo, *args, artifacts=None, lines=True):
    extra = []
    if artifacts is not None:
        extra = ["--saved-model", str(artifacts["saved_model"]), "--data", str(artifacts["data"]), "--atol", "0.1"]
    done = subprocess.run([str(S2T), *args, "--repository", str(repo), "--http-url", server.http_url, *extra],
                          capture_output=True, text=True, timeout=300, env={**os.environ, ADMIN_KEY_ENV: KEY})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] if lines else done.stdout


def s2t_json(server, repo, *args, artifacts=None) -> dict:
    """The command's --json document: stdout holds it alone, the words for people go to stderr."""
    return json.loads(s2t(server, repo, *args, "--json", artifacts=artifacts, lines=False))


def payloads(data, count, prefix):
    rows = data.records()
    return [json.dumps({"request_id": f"{prefix}-{i}", "features": rows[i % len(rows)]}).encode()
            for i in range(count)]


def infer(client, model, records):
    out = {"probability": [], "served_by": []}
    for start in range(0, len(records), 250):
        chunk = np.array(records[start:start + 250], dtype=object).reshape(-1, 1)
        tensor = grpc.InferInput("payload", list(chunk.shape), "BYTES")
        tensor.set_data_from_numpy(chunk)
        result = client.infer(model, [tensor])
        out["probability"] += result.as_numpy("probability").ravel().tolist()
        if model == "risk_router":
            out["served_by"] += [s.decode() for s in result.as_numpy("served_by").ravel()]
    return out


class Load:
    """One record at a time on risk_router and on risk_pipeline, PACE_S apart, counting every failure."""

    def __init__(self, url, records):
        self.url, self.records = url, records
        self.stop = threading.Event()
        self.failures, self.answers = [], 0
        self.threads = [threading.Thread(target=self._loop, args=(m,)) for m in ("risk_router", "risk_pipeline")]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _loop(self, model):
        client = grpc.InferenceServerClient(self.url)
        i = 0
        while not self.stop.wait(PACE_S):
            try:
                infer(client, model, [self.records[i % len(self.records)]])
                self.answers += 1
            except Exception as err:  # noqa: BLE001 - every failure counts
                self.failures.append(f"{model}: {err}")
            i += 1
        client.close()


def test_stage_canary_promote_moves_traffic_only_when_told_and_fails_no_request(live, built_artifacts, shifted,
                                                                                  german_credit_data):
    server, repo = live
    primary = VersionStore(repo).served("risk_scorer")[-1]
    old, client = f"risk_scorer:{primary}", grpc.InferenceServerClient(server.grpc_url)
    probe = payloads(german_credit_data, 200, "probe")
    baseline = infer(client, "risk_pipeline", probe)["probability"]
    with Load(server.grpc_url, payloads(german_credit_data, 50, "load")) as load:
        staged = int(s2t(server, repo, "publish", "risk_scorer", str(shifted), "--stage", artifacts=built_artifacts))
        new = f"risk_scorer:{staged}"
        assert client.is_model_ready("risk_scorer", str(staged))
        status = json.loads(s2t(server, repo, "status", "--json", "--history", "0", lines=False))["models"]
        assert {"version": staged, "role": "candidate", "folder": True, "state": "READY"} in \
            status["risk_scorer"]["versions"]
        assert status["risk_scorer"]["consumers"] == {"risk_router": primary, "risk_pipeline": primary,
                                                    "risk_pipeline_ensemble": primary}
        routed = infer(client, "risk_router", probe)
        assert routed["served_by"].count(new) == 0 and set(routed["served_by"]) == {old}
        assert infer(client, "risk_pipeline", probe)["probability"] == baseline

        assert s2t(server, repo, "canary", "risk_scorer", str(staged), "--percent", "10") == f"90% {old}, 10% {new}"
        distinct = payloads(german_credit_data, 2000, "canary")
        first = infer(client, "risk_router", distinct)["served_by"]
        again = infer(client, "risk_router", distinct)["served_by"]
        n, p = len(distinct), 0.10
        assert abs(first.count(new) - n * p) <= 3 * math.sqrt(n * p * (1 - p)), first.count(new)
        assert set(first) == {old, new} and again == first
        assert infer(client, "risk_pipeline", probe)["probability"] == baseline

        assert s2t(server, repo, "promote", "risk_scorer", str(staged)) == str(staged)
        assert set(infer(client, "risk_router", distinct)["served_by"]) == {new}
        promoted = infer(client, "risk_pipeline", probe)["probability"]
        assert np.allclose(promoted, np.minimum(np.array(baseline) + SHIFT, 1.0), atol=1e-5)
        assert client.is_model_ready("risk_scorer", str(primary)), "the old primary stays loaded for a rollback"
        time.sleep(0.5)
    client.close()
    assert load.failures == [], (len(load.failures), sorted(set(load.failures))[:5])
    assert load.answers > 100
    actions = [e["action"] for e in VersionStore(repo).history()][-3:]
    assert actions == ["stage", "canary", "promote"]


def stubs(server, model) -> set[int]:
    return {pid for pid, stub in stubs_of(server.process.pid).items() if stub.model == model}


class InForce:
    """The test's own clock: seconds from entering until risk_pipeline answers the probe with `expected`."""

    def __init__(self, url, records, expected):
        self.url, self.records, self.expected = url, records, np.array(expected)
        self.seconds, self.started = None, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def __enter__(self):
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        deadline = time.monotonic() + 60  # the command returned: the change is in force, or it never will be
        while self.seconds is None and time.monotonic() < deadline and not exc[0]:
            time.sleep(0.01)
        self._stop.set()
        self._thread.join(30)

    def _watch(self):
        client = grpc.InferenceServerClient(self.url)
        while not self._stop.is_set() and self.seconds is None:
            answered = np.array(infer(client, "risk_pipeline", self.records)["probability"])
            if np.allclose(answered, self.expected, atol=1e-5):
                self.seconds = time.monotonic() - self.started
        client.close()


def test_rollback_aborts_a_canary_and_after_a_promotion_serves_the_previous_version(live, built_artifacts, shifted,
                                                                                      german_credit_data):
    server, repo = live
    mode = server.model_control_mode
    primary = VersionStore(repo).served("risk_scorer")[-1]
    old, client = f"risk_scorer:{primary}", grpc.InferenceServerClient(server.grpc_url)
    probe = payloads(german_credit_data, 300, "probe")
    original = infer(client, "risk_pipeline", probe[:20])["probability"]
    with Load(server.grpc_url, payloads(german_credit_data, 50, "load")) as load:
        published = s2t_json(server, repo, "publish", "risk_scorer", str(shifted), "--stage", artifacts=built_artifacts)
        assert published == {"model": "risk_scorer", "version": published["version"], "staged": True}
        staged = published["version"]
        split = s2t_json(server, repo, "canary", "risk_scorer", str(staged), "--percent", "50")
        assert (split["primary"], split["candidate"], split["canary_percent"], split["shadow_percent"]) == \
            (old, f"risk_scorer:{staged}", 50.0, 0.0)
        assert f"risk_scorer:{staged}" in infer(client, "risk_router", probe)["served_by"]
        aborted = s2t_json(server, repo, "rollback", "risk_scorer", "--yes")
        assert (aborted["action"], aborted["serving"], aborted["previous"], aborted["retired"]) == \
            ("abort", primary, primary, [staged])
        assert set(infer(client, "risk_router", probe)["served_by"]) == {old}
        assert staged in VersionStore(repo).retired("risk_scorer"), "the aborted candidate is retired"

        again = int(s2t(server, repo, "publish", "risk_scorer", str(shifted), "--stage", artifacts=built_artifacts))
        assert s2t_json(server, repo, "promote", "risk_scorer", str(again))["primary"] == again
        assert set(infer(client, "risk_router", probe)["served_by"]) == {f"risk_scorer:{again}"}
        pipeline_stubs = stubs(server, "risk_pipeline")
        with InForce(server.grpc_url, probe[:20], original) as watch:
            reverted = s2t_json(server, repo, "rollback", "risk_scorer", "--yes")
            command_seconds = time.monotonic() - watch.started
        assert (reverted["action"], reverted["serving"], reverted["previous"]) == ("revert", primary, again)
        assert watch.seconds is not None, "risk_pipeline never served the previous version again"
        print(f"\nrollback ({mode}): risk_pipeline serves the previous version after {watch.seconds * 1000:.0f} ms, "
              f"the command returned after {command_seconds * 1000:.0f} ms")
        if mode == "explicit":
            # The previous version was warm in the pipeline: the live switch served it, no new stub was started.
            assert stubs(server, "risk_pipeline") <= pipeline_stubs
            assert watch.seconds < command_seconds
        assert set(infer(client, "risk_router", probe)["served_by"]) == {old}
        time.sleep(0.5)
    client.close()
    assert load.failures == [], (len(load.failures), sorted(set(load.failures))[:5])
    history = VersionStore(repo).history("risk_scorer")
    assert [(e["action"], e.get("aborted")) for e in history if e["action"] == "rollback"] == \
        [("rollback", True), ("rollback", False)]
