"""risk_router on the real server: served_by, canary split and stickiness, shadow isolation, the breaker."""
import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, S2T
from tests.integration.servers import triton_server
from s2t.control.live_control import admin_headers
from s2t.control.publish import ParityGate, publish
from s2t.control.version_store import VersionStore
from s2t.gate.canary_analysis import figures
from s2t.prometheus_text import parse_metrics

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


class ClientPerThread:
    """tritonclient's HTTP client is not thread-safe (gevent): one client per thread, all closed at the end."""

    def __init__(self, url):
        self.url, self._local, self._clients, self._lock = url, threading.local(), [], threading.Lock()

    def __call__(self):
        if not hasattr(self._local, "client"):
            self._local.client = http.InferenceServerClient(self.url, network_timeout=120)
            with self._lock:
                self._clients.append(self._local.client)
        return self._local.client

    def close(self):
        for client in self._clients:
            client.close()


def test_hundreds_of_routes_to_versions_that_do_not_exist_are_client_errors_and_add_no_metric_labels(
        triton, german_credit_data):
    """300 distinct forced versions, 8 at a time, beside a client sending valid records: each is refused 400 naming
    `route`, the valid records are all answered, and the metrics page does not grow with the bogus versions."""
    good = records(german_credit_data, 20, prefix="beside")
    bogus = [f"risk_scorer{'_lite' if i % 3 == 0 else ''}:{100_000 + i}" for i in range(300)]
    clients = ClientPerThread(triton.http_url)
    try:
        ask(clients(), good)
        ask(clients(), good, parameters={"route": f"risk_scorer:{newest('risk_scorer')}"})
        time.sleep(1.2)  # the router hands its histograms to Triton at most every second: let them all appear
        ask(clients(), good[:1], parameters={"route": "primary"})
        size_before = len(metrics(triton))

        def refused(route):
            try:
                ask(clients(), good[:2], parameters={"route": route})
            except InferenceServerException as err:
                return err.status(), err.message()
            return None, "answered"

        done, valid = threading.Event(), []

        def valid_traffic():
            while not done.is_set() and len(valid) < 200:
                valid.append(ask(clients(), good)["served_by"])

        with ThreadPoolExecutor(9) as pool:
            beside = pool.submit(valid_traffic)
            outcomes = list(pool.map(refused, bogus))
            done.set()
            beside.result(timeout=120)
        time.sleep(1.2)
        ask(clients(), good[:1], parameters={"route": "primary"})
        size_after = len(metrics(triton))
    finally:
        clients.close()
    for route, (status, message) in zip(bogus, outcomes):
        model, _, version = route.partition(":")
        assert status == "400", (route, status, message)
        assert f"route: {model} has no version {version}" in message, message
    assert valid and all(set(v) == {f"risk_scorer:{newest('risk_scorer')}".encode()} for v in valid)
    # Counters of series that already exist grow by a few digits at most; one series per bogus version would add
    # tens of kilobytes.
    assert size_after - size_before < 2_000, (size_before, size_after)


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


def test_forced_routes_do_not_move_the_canary_analysis(canary_server, german_credit_data):
    """A 50% canary with unforced traffic, and beside it a flood of records forced to the candidate and to the
    primary: the analysis' figures count exactly the unforced records the router split itself."""
    server, repo = canary_server
    versions = VersionStore(repo).served("risk_scorer")
    primary, candidate = f"risk_scorer:{versions[-1]}", f"risk_scorer:{versions[-2]}"
    canary(server, repo, "risk_scorer", str(versions[-2]), "--percent", "50")
    clients = ClientPerThread(server.http_url)
    rows = german_credit_data.records()
    # The flood: only the riskiest-looking records (the longest loans), forced to the candidate; a few to the primary.
    risky = sorted(rows, key=lambda r: -float(r["duration_in_month"]))[:50]
    flood = [json.dumps({"request_id": f"flood-{i}", "features": risky[i % len(risky)]}).encode() for i in range(600)]
    unforced = records(german_credit_data, 300, prefix="split")
    try:
        def flush():
            time.sleep(1.2)  # see test_hundreds_of_routes...: histograms reach Triton at most every second
            ask(clients(), unforced[:1], parameters={"route": "primary"})

        flush()
        before = parse_metrics(metrics(server))
        with ThreadPoolExecutor(3) as pool:
            forced_candidate = pool.submit(lambda: ask(clients(), flood[:500], parameters={"route": "candidate"}))
            forced_primary = pool.submit(lambda: ask(clients(), flood[500:], parameters={"route": primary}))
            answered = ask(clients(), unforced)["served_by"]
            assert set(forced_candidate.result(timeout=120)["served_by"]) == {candidate.encode()}
            assert set(forced_primary.result(timeout=120)["served_by"]) == {primary.encode()}
        flush()
        after = parse_metrics(metrics(server))
    finally:
        clients.close()
        canary(server, repo, "risk_scorer", "--off")
    step = figures(before, after, "canary", 50, primary, candidate)
    assert (step.candidate_rows, step.primary_rows) == (answered.count(candidate.encode()),
                                                        answered.count(primary.encode()))
    assert step.candidate_rows + step.primary_rows == len(unforced) and step.failed_rows == 0
    forced = {version: after.get(("s2t_router_forced_rows_total", frozenset({("model", "risk_scorer"),
                                                                              ("version", version)})), 0.0)
              - before.get(("s2t_router_forced_rows_total", frozenset({("model", "risk_scorer"),
                                                                        ("version", version)})), 0.0)
              for version in (str(versions[-2]), str(versions[-1]))}
    assert forced == {str(versions[-2]): 500.0, str(versions[-1]): 101.0}
