"""The README's examples work against the real server."""
import json
import subprocess
import sys

import numpy as np

from s2t.clients.risk_client import score
from tests.conftest import ROOT

EXAMPLES = ROOT / "clients" / "examples"


def test_curl_example_body_scores_the_example_record(triton):
    body = (EXAMPLES / "risk_pipeline_request.json").read_bytes()
    assert json.loads(json.loads(body)["inputs"][0]["data"][0]) == json.loads((EXAMPLES / "record.json").read_text())
    done = subprocess.run(["curl", "-s", "--fail-with-body", f"http://{triton.http_url}/v2/models/risk_pipeline/infer",
                           "-H", "Content-Type: application/json", "-d", f"@{EXAMPLES / 'risk_pipeline_request.json'}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = {o["name"]: o["data"][0] for o in json.loads(done.stdout)["outputs"]}
    assert 0 <= outputs["probability"] <= 1 and outputs["decision"] in ("APPROVE", "REVIEW", "DECLINE")


def test_risk_client_gives_the_legacy_scores_and_the_same_answers_over_http_and_grpc(triton, german_credit_data,
                                                                                     legacy_scores):
    records = [{"request_id": f"r-{i}", "features": f} for i, f in enumerate(german_credit_data.records()[:20])]
    over_http = score(records, triton.http_url, "http")
    over_grpc = score(records, triton.grpc_url, "grpc")
    for answers in (over_http, over_grpc):
        assert [s.request_id for s in answers] == [f"r-{i}" for i in range(20)]
    np.testing.assert_allclose([s.probability for s in over_http], legacy_scores[:20], atol=1e-5)
    assert [(s.probability, s.decision) for s in over_grpc] == [(s.probability, s.decision) for s in over_http]


def test_risk_client_command_prints_one_line_per_record(triton):
    done = subprocess.run([sys.executable, "-m", "s2t.clients.risk_client", str(EXAMPLES / "record.json"), "--url",
                           triton.http_url], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    request_id, probability, decision = done.stdout.strip().split("\t")
    assert request_id == "r-1" and 0 <= float(probability) <= 1 and decision in ("APPROVE", "REVIEW", "DECLINE")
