"""The README's examples work against the real server."""
import json
import subprocess
import sys
import urllib.request

import pytest

from clients.risk_client import score
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


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_risk_client_gives_the_same_scores_over_http_and_grpc(triton, german_credit_data, protocol):
    records = [{"request_id": f"r-{i}", "features": f} for i, f in enumerate(german_credit_data.records()[:20])]
    url = triton.http_url if protocol == "http" else triton.grpc_url
    scores = score(records, url, protocol)
    reference = score(records, triton.http_url, "http")
    assert [s.request_id for s in scores] == [f"r-{i}" for i in range(20)]
    assert [(s.probability, s.decision) for s in scores] == [(s.probability, s.decision) for s in reference]


def test_risk_client_command_prints_one_line_per_record(triton):
    done = subprocess.run([sys.executable, "-m", "clients.risk_client", str(EXAMPLES / "record.json"), "--url",
                           triton.http_url], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    request_id, probability, decision = done.stdout.strip().split("\t")
    assert request_id == "r-1" and 0 <= float(probability) <= 1 and decision in ("APPROVE", "REVIEW", "DECLINE")
