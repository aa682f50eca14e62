"""`s2t score` against the real server: one record in, its answer as JSON out; a bad record gets the server's
per-field error and its own exit code, also when many are scored at once."""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT, S2T
from s2t import errors

RECORD = json.loads((ROOT / "clients" / "examples" / "record.json").read_text())


def score(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(S2T), "score", *args], cwd=ROOT, capture_output=True, text=True, input=stdin,
                          timeout=120)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_score_prints_the_answer_of_risk_pipeline_as_json(triton, protocol, http_client):
    url = triton.http_url if protocol == "http" else triton.grpc_url
    done = score("clients/examples/record.json", f"--{protocol}-url", url)
    assert done.returncode == errors.OK, done.stderr
    answer = json.loads(done.stdout)
    import numpy as np
    import tritonclient.http as http
    payload = http.InferInput("payload", [1, 1], "BYTES")
    payload.set_data_from_numpy(np.array([[json.dumps(RECORD).encode()]], dtype=object))
    direct = http_client.infer("risk_pipeline", [payload])
    assert answer["request_id"] == "r-1"
    assert answer["probability"] == pytest.approx(float(direct.as_numpy("probability").ravel()[0]), abs=1e-6)
    assert answer["decision"] == direct.as_numpy("decision").ravel()[0].decode()


def test_score_reads_the_record_from_stdin(triton):
    done = score("-", "--http-url", triton.http_url, stdin=json.dumps(RECORD))
    assert done.returncode == errors.OK, done.stderr
    assert json.loads(done.stdout)["decision"] in {"APPROVE", "REVIEW", "DECLINE"}


def _without(field: str) -> str:
    features = {k: v for k, v in RECORD["features"].items() if k != field}
    return json.dumps({**RECORD, "features": features})


BAD_RECORDS = {
    "missing-attribute": (_without("duration_in_month"), "duration_in_month"),
    "wrong-type": (json.dumps({**RECORD, "features": {**RECORD["features"], "age_in_years": "old"}}), "age_in_years"),
    "not-json": ('{"request_id": "r-1", "features": {', "JSON"),
}


@pytest.mark.parametrize("record, field", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_a_bad_record_exits_rejected_with_the_servers_message_naming_the_field(triton, record, field):
    done = score("-", "--http-url", triton.http_url, stdin=record)
    assert done.returncode == errors.REJECTED, done.stdout + done.stderr
    assert field in done.stderr and field in json.loads(done.stdout)["error"]
    assert "Traceback" not in done.stderr


def test_bad_and_good_records_scored_at_once_each_get_their_own_answer(triton):
    good, bad = json.dumps(RECORD), _without("credit_amount")
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda r: (r, score("-", "--grpc-url", triton.grpc_url, stdin=r)), [good, bad] * 6))
    for record, done in runs:
        if record == good:
            assert done.returncode == errors.OK and json.loads(done.stdout)["probability"] >= 0, done.stderr
        else:
            assert done.returncode == errors.REJECTED and "credit_amount" in done.stderr, done.stderr


def test_score_against_a_port_where_nothing_listens_exits_unreachable(tmp_path):
    from s2t.serve.triton_server import free_port
    done = score("clients/examples/record.json", "--grpc-url", f"localhost:{free_port()}")
    assert done.returncode == errors.UNREACHABLE and "unreachable" in done.stderr
