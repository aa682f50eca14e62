"""Feature drift on the live server, at the shipped window, minimum sample and alert rule (the publish interval is
1 s here instead of 5 s, to keep the test short): the training rows replayed over HTTP and gRPC, in file order and
shuffled, flag nothing and raise no alert, also once traffic stops; known shifts flag exactly the moved feature
within one window (2,000 records); a new version's shifted scores flag the score, and a version published through
the gate brings its own score reference."""
import json
import math
import subprocess
import threading
import time

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from onnx import numpy_helper

from s2t.backends.routing.drift_watch import DriftMonitor, Reference
from s2t.backends.records.feature_spec import FeatureSpec
from s2t.control.config_edit import set_string_parameter
from s2t.control.publish import ParityGate, publish
from tests.conftest import S2T
from tests.integration.servers import repository_copies, serving, triton_server

PUBLISH_SECONDS = 1
WINDOW = 2000  # the shipped drift_window_records
ALERT_PSI = 0.2  # deploy/prometheus/alerts.yml: FeatureDrift
SETTLE_SECONDS = 120  # a bound for a loaded machine; a quiet one settles within about two publish intervals


@pytest.fixture(scope="module")
def drift_server(tmp_path_factory, built_artifacts):
    root = tmp_path_factory.mktemp("drift")
    repo, ensembles = repository_copies(root)
    config = repo / "risk_router" / "config.pbtxt"
    assert 'key: "drift_window_records" value: { string_value: "2000" }' in config.read_text()
    config.write_text(set_string_parameter(config.read_text(), "drift_publish_seconds", str(PUBLISH_SECONDS)))
    with serving(triton_server([repo, ensembles], log_path=root / "triton.log")) as server:
        yield server, repo


def send(server, records, protocol):
    """In batches of 100 records per request; every record must be answered."""
    probabilities = []
    client = (grpc.InferenceServerClient(server.grpc_url) if protocol == "grpc"
              else http.InferenceServerClient(server.http_url))
    module = grpc if protocol == "grpc" else http
    try:
        for start in range(0, len(records), 100):
            batch = np.array([[json.dumps(r).encode()] for r in records[start:start + 100]], dtype=object)
            tensor = module.InferInput("payload", list(batch.shape), "BYTES")
            tensor.set_data_from_numpy(batch)
            answer = client.infer("risk_router", [tensor])
            probabilities.append(answer.as_numpy("probability"))
    finally:
        client.close()
    return np.concatenate(probabilities)


def report(server):
    """`s2t drift --json`, reading the metrics port given as HOST:PORT."""
    done = subprocess.run([str(S2T), "drift", "--json", "--metrics-url", f"localhost:{server.metrics_port}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def waited(server, ready, what):
    """The first report `ready` accepts, read every half second (bounded)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        latest = report(server)
        if ready(latest):
            return latest
        assert time.monotonic() < deadline, f"never {what}: reference {latest['reference']}, {latest}"
        time.sleep(0.5)


def settled(server, sent):
    """The report once it counts the `sent` records the router has seen since it started: the timer publishes a
    burst's last records after traffic stopped (no record is sent while waiting)."""
    latest = waited(server, lambda r: r["sampled_records"] == sent, f"counted {sent} records")
    features = {k: v for k, v in latest["features"].items() if k != "score"}
    assert len(features) == 20 and all(f["sample"] == min(sent, WINDOW) for f in features.values()), latest
    return latest


def flagged(latest):
    return {name for name, figure in latest["features"].items() if figure["state"] == "drift"}


def alerting(latest):
    """FeatureDrift's expression (deploy/prometheus/alerts.yml) on the same series: PSI over 0.2 and over its noise
    level; a NaN (not enough data) compares false."""
    return {name for name, f in latest["features"].items()
            if f["psi"] is not None and f["psi"] > ALERT_PSI and f["psi"] > f["noise_psi"]}


def requests_of(rows):
    return [{"request_id": f"r-{i}", "features": row} for i, row in enumerate(rows)]


def _bad_records(server, rows, answers):
    """A hostile client beside the replay: records that cannot be decoded, one per request; each must fail alone."""
    client = grpc.InferenceServerClient(server.grpc_url)
    bad = [b"{not json", json.dumps({"features": {**rows[0], "credit_amount": "many"}}).encode(),
           json.dumps({"features": {k: v for k, v in rows[0].items() if k != "purpose"}}).encode(),
           json.dumps({"features": {**rows[0], "age_in_years": float("nan")}}).encode()]
    try:
        for i in range(60):
            tensor = grpc.InferInput("payload", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[bad[i % len(bad)]]], dtype=object))
            try:
                client.infer("risk_router", [tensor])
                answers.append("answered")
            except grpc.InferenceServerException as err:
                answers.append(err.message())
    finally:
        client.close()


def test_replaying_the_training_rows_flags_nothing_and_fires_no_alert(drift_server, german_credit_data):
    server, repo = drift_server
    rows = german_credit_data.records()
    reference_version = 1 if (repo / "risk_scorer" / "1" / "drift_reference.json").is_file() else 0
    rng = np.random.default_rng(24)
    total = 0
    for count, order, protocol in [(1000, "file", "http"), (1000, "shuffled", "grpc"), (5000, "file", "grpc"),
                                   (5000, "shuffled", "http")]:
        replay = [rows[i % len(rows)] for i in range(count)]
        if order == "shuffled":
            rng.shuffle(replay)
        hostile, refused = None, []
        if total == 0:
            hostile = threading.Thread(target=_bad_records, args=(server, rows, refused))
            hostile.start()
        send(server, requests_of(replay), protocol)
        if hostile is not None:
            hostile.join(timeout=SETTLE_SECONDS)
            # Every bad record answered with its own error naming the field; none of them reached the drift window.
            assert len(refused) == 60 and all(a != "answered" for a in refused), refused
            assert all(name in " ".join(refused) for name in ("credit_amount", "purpose", "age_in_years")), refused
        total += count
        latest = settled(server, total)
        # The served version's own score reference when its publish wrote one (a gated publish does), else the
        # training data's (version 0).
        assert latest["window_records"] == WINDOW and latest["reference_version"] == reference_version
        assert latest["features"]["score"]["sample"] == min(total, WINDOW)
        assert flagged(latest) == set() and alerting(latest) == set(), (count, order, protocol, latest)
        time.sleep(2 * PUBLISH_SECONDS)  # traffic stopped: the timer's later figures say the same
        again = report(server)
        assert flagged(again) == set() and alerting(again) == set(), (count, order, protocol, again)
    table = subprocess.run([str(S2T), "drift", "--metrics-url", f"localhost:{server.metrics_port}"],
                           capture_output=True, text=True, timeout=60).stdout
    named_reference = "version 1's own" if reference_version else "drift_reference.json"
    assert "last 2000 records" in table and named_reference in table and "DRIFT" not in table


def _shifted(rows, kind, rng):
    records = [dict(rows[i % len(rows)]) for i in range(WINDOW)]
    if kind == "credit_amount":  # a numeric feature scaled
        for r in records:
            r["credit_amount"] *= 4
    elif kind == "status_of_existing_checking_account":  # a category's share doubled: 27.4% -> 54.8%
        value = "... < 0 DM"
        others = [r for r in records if r[kind] != value]
        for r in rng.choice(others, size=sum(r[kind] == value for r in records), replace=False):
            r[kind] = value
    elif kind == "purpose":  # a new category, unseen in training, on 10% of the records
        for r in rng.choice(records, size=WINDOW // 10, replace=False):
            r["purpose"] = "solar panels"
    return records


def _score_moved(repo, probabilities):
    """The rule applied to the scores the server answered, against the same reference."""
    spec = FeatureSpec.from_file(repo / "risk_router" / "1" / "feature_spec.json")
    monitor = DriftMonitor(Reference.from_json((repo / "risk_router" / "1" / "drift_reference.json").read_text()),
                           spec)
    zeros = (np.zeros((len(probabilities), len(spec.categorical)), np.int64),
             np.zeros((len(probabilities), len(spec.numeric)), np.float32))
    monitor.observe(*zeros, probabilities)
    return monitor.figures()["score"].drifted


@pytest.mark.parametrize("moved", ["credit_amount", "status_of_existing_checking_account", "purpose"])
def test_a_known_shift_flags_exactly_the_moved_feature_within_one_window(drift_server, german_credit_data, moved):
    server, repo = drift_server
    before = report(server)["sampled_records"]
    probabilities = send(server, requests_of(_shifted(german_credit_data.records(), moved,
                                                      np.random.default_rng(7))), "grpc")
    latest = settled(server, before + WINDOW)
    expected = {moved} | ({"score"} if _score_moved(repo, probabilities) else set())
    assert flagged(latest) == expected and alerting(latest) == expected, latest
    top = latest["features"][moved]["top_bins"][0]
    assert abs(top["live_share"] - top["reference_share"]) >= 0.09, top  # the smallest shift moves 10% of records
    done = subprocess.run([str(S2T), "drift", "--metrics-url", f"localhost:{server.metrics_port}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    print("\n" + done.stdout)
    assert f"{top['bin']}: {top['reference_share']:.1%} -> {top['live_share']:.1%}" in done.stdout, done.stdout


def test_a_new_versions_shifted_scores_flag_the_score_and_a_gated_version_brings_its_own_reference(
        drift_server, german_credit_data, built_artifacts, tmp_path):
    server, repo = drift_server
    rows = german_credit_data.records()
    model = onnx.load(str(built_artifacts["onnx"]))
    biggest = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    # The first hidden layer's weights x3: scores spread out (PSI about 0.9 against the first version's), the features
    # are the same records.
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * np.float32(3.0), biggest.name))
    shifted = tmp_path / "shifted.onnx"
    onnx.save(model, str(shifted))
    # No gate: no data to build the version's own reference, so its scores meet the first version's.
    version = publish("risk_scorer", shifted, repo, None, url=server.http_url)
    assert not (repo / "risk_scorer" / str(version) / "drift_reference.json").exists()
    waited(server, lambda r: r["sampled_records"] == 0, "reloaded the router")
    send(server, requests_of([rows[i % len(rows)] for i in range(WINDOW)]), "grpc")
    latest = settled(server, WINDOW)  # the router reloaded with the new primary: a new window
    assert latest["features"]["score"]["sample"] == WINDOW
    assert flagged(latest) == {"score"} and alerting(latest) == {"score"}, latest
    # Through the gate: the version's own scores on the gate's data become the score reference.
    gated = publish("risk_scorer", built_artifacts["onnx"], repo,
                    ParityGate(built_artifacts["saved_model"], built_artifacts["data"]), url=server.http_url)
    assert (repo / "risk_scorer" / str(gated) / "drift_reference.json").is_file()
    waited(server, lambda r: r["reference_version"] == gated, f"reloaded the router with version {gated}'s reference")
    send(server, requests_of([rows[i % len(rows)] for i in range(WINDOW)]), "http")
    latest = settled(server, WINDOW)
    assert latest["reference"].startswith(f"version {gated}'s own")
    assert flagged(latest) == set() and alerting(latest) == set(), latest
    assert not math.isnan(latest["features"]["score"]["psi"])
