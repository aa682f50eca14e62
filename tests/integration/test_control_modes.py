"""The embedded server in explicit model-control mode loads every model at start and accepts load/unload."""
import json

import numpy as np
import tritonclient.http as http

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from tools.triton_server import TritonServer


def test_explicit_mode_loads_every_model_and_serves_the_pipeline(german_credit_data, tmp_path):
    server = TritonServer([MODEL_REPOSITORY, ENSEMBLES], free_port(), free_port(), free_port(),
                          model_control_mode="explicit", log_path=tmp_path / "triton.log", exit_timeout_seconds=5)
    with server:
        client = http.InferenceServerClient(server.http_url)
        try:
            index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
            assert index == {name: "READY" for name in
                             ("risk_pipeline", "risk_scorer", "skill_adapter", "risk_decision")}
            payload = http.InferInput("payload", [1, 1], "BYTES")
            payload.set_data_from_numpy(np.array([[json.dumps({"features": german_credit_data.records()[5]})
                                                   .encode()]], dtype=object))
            assert client.infer("risk_pipeline", [payload]).as_numpy("decision").shape == (1, 1)
            client.unload_model("risk_decision")
            assert not client.is_model_ready("risk_decision")
            client.load_model("risk_decision")
            assert client.is_model_ready("risk_decision")
        finally:
            client.close()
