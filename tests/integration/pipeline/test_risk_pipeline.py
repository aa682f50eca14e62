"""risk_pipeline end to end on the real server: every German Credit row against the legacy SavedModel; the same
for risk_pipeline_ensemble, the composed path the NGC image serves."""
import json

import numpy as np
import pytest

from s2t.backends.scoring.decision_policy import decide
from s2t.gate import parity

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def legacy(legacy_scores):
    return legacy_scores


@pytest.mark.parametrize("model, protocol", [("risk_pipeline", "http"), ("risk_pipeline", "grpc"),
                                             ("risk_pipeline_ensemble", "grpc")])
def test_every_row_through_the_pipeline_matches_the_legacy_model(model, protocol, triton, built_artifacts,
                                                                   german_credit_data, legacy):
    url = triton.http_url if protocol == "http" else triton.grpc_url
    served = parity.live_scores(url, model, built_artifacts["onnx"], german_credit_data, protocol)
    assert served.shape == (1000,)
    comparison = parity.compare(protocol, legacy, served, TOLERANCE)
    assert comparison.rows_over_tolerance == 0, comparison
    assert np.all((served >= 0) & (served <= 1))


def test_decisions_follow_the_thresholds_in_the_config(http_client, german_credit_data, decision_thresholds):
    import tritonclient.http as http
    thresholds = decision_thresholds
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:200]]
    payload = http.InferInput("payload", [len(records), 1], "BYTES")
    payload.set_data_from_numpy(np.array(records, dtype=object).reshape(-1, 1))
    result = http_client.infer("risk_pipeline", [payload])
    probability, decision = result.as_numpy("probability"), result.as_numpy("decision")
    assert decision.shape == (200, 1)
    assert decision.ravel().tolist() == decide(probability, thresholds).ravel().tolist()
    assert set(decision.ravel().tolist()) == {b"APPROVE", b"REVIEW", b"DECLINE"}


def test_a_legacy_record_posted_as_plain_json_gets_a_probability_and_a_decision(triton, german_credit_data):
    import urllib.request
    record = {"request_id": "r-1", "stream_id": "s-7", "sequence_id": 12, "features": german_credit_data.records()[0]}
    body = json.dumps({"inputs": [{"name": "payload", "shape": [1, 1], "datatype": "BYTES",
                                   "data": [json.dumps(record)]}]}).encode()
    request = urllib.request.Request(f"http://{triton.http_url}/v2/models/risk_pipeline/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        outputs = {o["name"]: o["data"] for o in json.load(resp)["outputs"]}
    assert 0.0 <= outputs["probability"][0] <= 1.0
    assert outputs["decision"][0] in ("APPROVE", "REVIEW", "DECLINE")


@pytest.mark.parametrize("model, protocol", [("risk_pipeline", "http"), ("risk_scorer", "grpc")])
def test_parity_command_checks_the_live_model_and_writes_a_report(triton, built_artifacts, tmp_path, model, protocol):
    import subprocess
    import sys
    from pathlib import Path
    report = tmp_path / "parity.json"
    url = triton.http_url if protocol == "http" else triton.grpc_url
    done = subprocess.run([str(Path(sys.executable).parent / "s2t"), "parity", "--saved-model",
                           str(built_artifacts["saved_model"]), "--onnx", str(built_artifacts["onnx"]), "--data",
                           str(built_artifacts["data"]), f"--{protocol}-url", url, "--model", model,
                           "--report", str(report), "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(report.read_text())
    assert json.loads(done.stdout) == result and "parity against" in done.stderr
    assert result["passed"] and result["rows"] == 1000
    assert [c["candidate"] for c in result["comparisons"]] == ["onnxruntime risk_scorer.onnx",
                                                               f"triton {model} ({protocol})"]
    assert all(c["rows_over_tolerance"] == 0 and c["max_abs"] <= TOLERANCE for c in result["comparisons"])
    assert "PASS" in done.stderr
    # The live side reports its batches on stderr, a line per tenth on a pipe, while stdout stays the JSON above.
    live = [line for line in done.stderr.splitlines() if line.startswith(f"parity: triton {model} ({protocol}): ")]
    assert 2 <= len(live) <= 11 and "1000/1000 rows (100%)" in live[-1]
