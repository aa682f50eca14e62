"""Feature drift on the live server: records whose credit_amount is five times the training data's show up as
PSI over 0.2 for that feature in s2t_feature_psi (and `s2t drift`), the untouched features stay low."""
import json
import shutil
import subprocess
import time

import numpy as np
import tritonclient.grpc as grpc

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, S2T
from s2t.control.config_edit import set_string_parameter
from tests.integration.servers import triton_server

PUBLISH_SECONDS = 1


def send(client, records):
    for start in range(0, len(records), 100):
        batch = np.array([[json.dumps(r).encode()] for r in records[start:start + 100]], dtype=object)
        tensor = grpc.InferInput("payload", list(batch.shape), "BYTES")
        tensor.set_data_from_numpy(batch)
        client.infer("risk_router", [tensor])


def drift(server):
    done = subprocess.run([str(S2T), "drift", "--json", "--http-url", server.http_url, "--metrics-url",
                           f"http://localhost:{server.metrics_port}/metrics"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_drifted_feature_shows_psi_over_the_alert_level_and_the_others_do_not(built_artifacts, german_credit_data,
                                                                                tmp_path):
    repo = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    assert (repo / "risk_router" / "1" / "drift_reference.json").is_file(), "`make` builds the drift reference"
    config = repo / "risk_router" / "config.pbtxt"
    config.write_text(set_string_parameter(config.read_text(), "drift_publish_seconds", str(PUBLISH_SECONDS)))
    rows = german_credit_data.records()
    drifted = [{"request_id": f"d-{i}", "features": {**rows[i % len(rows)],
                                                      "credit_amount": rows[i % len(rows)]["credit_amount"] * 5}}
               for i in range(3000)]
    server = triton_server([repo, ENSEMBLES],
                           log_path=tmp_path / "triton.log")
    with server:
        client = grpc.InferenceServerClient(server.grpc_url)
        send(client, drifted)
        time.sleep(PUBLISH_SECONDS + 0.5)
        send(client, drifted[:100])  # the gauges are set by the first batch after the publish interval
        client.close()
        values = drift(server)
        table = subprocess.run([str(S2T), "drift", "--metrics-url", f"http://localhost:{server.metrics_port}/metrics"],
                               capture_output=True, text=True, timeout=60).stdout
    print("\n" + table)
    assert values["credit_amount"] > 0.2
    assert "credit_amount" in table.splitlines()[1] and "DRIFT" in table.splitlines()[1]
    untouched = {k: v for k, v in values.items() if k not in ("credit_amount", "score")}
    assert len(untouched) == 19 and max(untouched.values()) < 0.2, untouched
