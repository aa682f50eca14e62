"""risk_router on the real server: served_by, canary split and stickiness, shadow isolation, the breaker."""
import json
import math
import re
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, S2T
from tests.integration.servers import triton_server
from s2t.control.live_control import admin_headers
from s2t.control.publish import ParityGate, publish
from s2t.control.version_store import VersionStore
from s2t.gate.canary_analysis import parse_metrics

KEY = "router-key"


def records(data, count, prefix="r"):
    rows = data.records()
    return [json.dumps({"request_id": f"{prefix}-{i}", "features": rows[i % len(rows)]}).encode() for i in range(count)]


def ask(client, payloads, model="risk_router", parameters=None):
    """All records, 250 per request; returns probability, decision and served_by for each record."""
    out = {"probability": [], "decision": [], "served_by": []}
    for start in range(0, len(payloads), 250):
        chunk = np.array(payloads[start:start + 250], dtype=object).reshape(-1, 1)
        tensor = http.InferInput("payload", list(chunk.shape), "BYTES")
        tensor.set_data_from_numpy(chunk)
        result = client.infer(model, [tensor], parameters=parameters)
        for name in out:
            if model == "risk_router" or name != "served_by":
                out[name] += result.as_numpy(name).ravel().tolist()
    return out


def metrics(server) -> str:
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def labelled(text: str, name: str, **labels) -> list[tuple[dict[str, str], float]]:
    """The samples of `name` that carry these labels, with all their labels and values."""
    return [(dict(found), value) for (sample, found), value in parse_metrics(text).items()
            if sample == name and labels.items() <= found]


def newest(model):
    return VersionStore(MODEL_REPOSITORY).served(model)[-1]


def test_router_answers_like_the_pipeline_and_names_the_newest_version(triton, http_client, german_credit_data):
    payloads = records(german_credit_data, 300)
    routed, pipeline = ask(http_client, payloads), ask(http_client, payloads, "risk_pipeline")
    assert routed["probability"] == pipeline["probability"]
    assert routed["decision"] == pipeline["decision"]
    assert set(routed["served_by"]) == {f"risk_scorer:{newest('risk_scorer')}".encode()}
    rows = labelled(metrics(triton), "s2t_router_rows_total", model="risk_scorer", version=str(newest("risk_scorer")))
    assert rows and rows[0][1] >= 300


def test_route_parameter_colours_a_request(http_client, german_credit_data):
    lite = f"risk_scorer_lite:{newest('risk_scorer_lite')}"
    answer = ask(http_client, records(german_credit_data, 10), parameters={"route": lite})
    assert set(answer["served_by"]) == {lite.encode()}


def test_bad_record_fails_its_request_alone(http_client, german_credit_data):
    good = records(german_credit_data, 1)[0]
    broken = json.loads(good)
    del broken["features"]["purpose"]
    with pytest.raises(InferenceServerException, match="features.purpose: missing"):
        ask(http_client, [json.dumps(broken).encode()])
    assert ask(http_client, [good])["served_by"]


@pytest.fixture(scope="module")
def canary_server(built_artifacts, tmp_path_factory):
    """Poll mode on a private repository with a second risk_scorer version: the canary's candidate is the older."""
    root = tmp_path_factory.mktemp("canary")
    repo = root / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    publish("risk_scorer", built_artifacts["onnx"], repo, ParityGate(built_artifacts["saved_model"],
                                                                    built_artifacts["data"]))
    server = triton_server([repo, ENSEMBLES], log_path=root / "triton.log")
    with server:
        yield server, repo


def canary(server, repo, *args):
    done = subprocess.run([str(S2T), "canary", *args, "--repository", str(repo), "--http-url", server.http_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_ten_percent_canary_gets_ten_percent_of_2000_records_and_sticks(canary_server, german_credit_data):
    server, repo = canary_server
    versions = VersionStore(repo).served("risk_scorer")
    old, new = f"risk_scorer:{versions[-2]}".encode(), f"risk_scorer:{versions[-1]}".encode()
    assert canary(server, repo, "risk_scorer", str(versions[-2]), "--percent", "10") == \
        f"90% risk_scorer:{versions[-1]}, 10% risk_scorer:{versions[-2]}"
    client = http.InferenceServerClient(server.http_url)
    try:
        payloads = records(german_credit_data, 2000)
        first = ask(client, payloads)["served_by"]
        again = ask(client, payloads)["served_by"]
    finally:
        client.close()
    assert set(first) == {old, new}
    n, p = 2000, 0.10
    assert abs(first.count(old) - n * p) <= 4 * math.sqrt(n * p * (1 - p)), first.count(old)
    assert again == first, "the same request_id goes to the same version"
    assert canary(server, repo, "risk_scorer", "--off") == f"100% risk_scorer:{versions[-1]}"


def test_shadow_mirrors_without_changing_an_answer(canary_server, german_credit_data):
    server, repo = canary_server
    versions = VersionStore(repo).served("risk_scorer")
    client = http.InferenceServerClient(server.http_url)
    try:
        payloads = records(german_credit_data, 1000, prefix="s")
        before = ask(client, payloads)
        canary(server, repo, "risk_scorer", str(versions[-2]), "--percent", "50", "--shadow")
        during = ask(client, payloads)
    finally:
        client.close()
        canary(server, repo, "risk_scorer", "--off")
    assert during == before
    assert set(during["served_by"]) == {f"risk_scorer:{versions[-1]}".encode()}
    text, candidate = metrics(server), {"model": "risk_scorer", "version": str(versions[-2])}
    assert "# TYPE s2t_router_shadow_abs_diff histogram" in text
    [(_, count)] = labelled(text, "s2t_router_shadow_abs_diff_count", **candidate)
    assert 350 < count < 650
    # Both versions are the same conversion: every mirrored difference is in the smallest bucket.
    smallest = min(labelled(text, "s2t_router_shadow_abs_diff_bucket", **candidate), key=lambda b: float(b[0]["le"]))
    assert float(smallest[0]["le"]) == 1e-7 and smallest[1] == count


@pytest.fixture
def breaker_server(built_artifacts, tmp_path):
    """Explicit mode, so that the test can take the primary away and bring it back; a short open time."""
    repo = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / "risk_router" / "config.pbtxt"
    text = config.read_text()
    for key, value in (("breaker_open_seconds", "1"), ("breaker_min_requests", "5")):
        text, count = re.subn(r'(key: "' + key + r'" value: \{ string_value: ")[^"]*', r"\g<1>" + value, text)
        assert count == 1, key
    config.write_text(text)
    server = triton_server([repo, ENSEMBLES], model_control_mode="explicit",
                           admin_key=KEY, log_path=tmp_path / "triton.log")
    with server:
        yield server


def test_breaker_answers_from_the_lite_model_while_the_primary_fails_then_recovers(breaker_server,
                                                                                   german_credit_data):
    server = breaker_server
    client = http.InferenceServerClient(server.http_url)
    lite, primary = f"risk_scorer_lite:{newest('risk_scorer_lite')}", f"risk_scorer:{newest('risk_scorer')}"
    payloads = records(german_credit_data, 20)
    try:
        assert set(ask(client, payloads)["served_by"]) == {primary.encode()}
        client.unload_model("risk_scorer", headers=admin_headers(KEY))
        failing = ask(client, payloads)
        assert set(failing["served_by"]) == {lite.encode()}, "no request fails: the fallback answers"
        assert 's2t_router_breaker_state{state="open"} 1' in metrics(server)
        client.load_model("risk_scorer", headers=admin_headers(KEY))
        deadline = time.monotonic() + 15
        while set(ask(client, payloads)["served_by"]) != {primary.encode()}:
            assert time.monotonic() < deadline, "the primary never took traffic back"
            time.sleep(0.2)
        assert 's2t_router_breaker_state{state="closed"} 1' in metrics(server)
        assert re.search(r"s2t_router_fallback_rows_total (\d+)", metrics(server)).group(1) != "0"
    finally:
        client.close()
