"""Explicit model-control mode: every model loaded at start, the repository API only for holders of the key."""
import json

import numpy as np
import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from s2t.control.live_control import admin_headers
from tests.integration.servers import EXPLICIT_ADMIN_KEY as KEY


def test_explicit_mode_loads_every_model_and_serves_the_pipeline(triton_explicit, german_credit_data):
    client = http.InferenceServerClient(triton_explicit.http_url)
    try:
        index = {m["name"]: m.get("state") for m in client.get_model_repository_index(headers=admin_headers(KEY))}
        models = {p.parent.name for repo in (MODEL_REPOSITORY, ENSEMBLES) for p in repo.glob("*/config.pbtxt")}
        assert index == {name: "READY" for name in models}
        payload = http.InferInput("payload", [1, 1], "BYTES")
        payload.set_data_from_numpy(np.array([[json.dumps({"features": german_credit_data.records()[5]}).encode()]],
                                             dtype=object))
        assert client.infer("risk_pipeline", [payload]).as_numpy("decision").shape == (1, 1)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_scoring_client_without_the_key_cannot_load_or_unload(triton_explicit, protocol):
    module, url = (http, triton_explicit.http_url) if protocol == "http" else (grpc, triton_explicit.grpc_url)
    client = module.InferenceServerClient(url)
    try:
        for call in (lambda h: client.unload_model("risk_decision", headers=h),
                     lambda h: client.load_model("risk_decision", headers=h)):
            for headers in ({}, {"admin-key": "wrong"}):
                with pytest.raises(InferenceServerException, match="restricted"):
                    call(headers)
        assert client.is_model_ready("risk_decision")
    finally:
        client.close()


def test_holder_of_the_key_can_unload_and_load(triton_explicit):
    client = http.InferenceServerClient(triton_explicit.http_url)
    try:
        client.unload_model("risk_decision", headers=admin_headers(KEY))
        assert not client.is_model_ready("risk_decision")
        client.load_model("risk_decision", headers=admin_headers(KEY))
        assert client.is_model_ready("risk_decision")
    finally:
        client.close()
