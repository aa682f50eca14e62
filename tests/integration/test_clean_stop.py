"""A stop or a reload of the python models is clean: no stub dies on its way out (faulthandler would print `Fatal
Python error` to the server's log, and an operator could not tell a crash from a stop)."""
import json
import re
import time

import numpy as np
import pytest
import tritonclient.http as http

from clients import stream_client
from s2t.control.live_control import admin_headers
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

KEY = "clean-stop-key"
CRASH = re.compile(r"Fatal Python error|Segmentation fault|Signal \(11\)|Aborted|core dumped")
# The python models of the repository (risk_scorer runs on backends/onnxruntime/model.py here), each reloaded once.
PYTHON_MODELS = ("skill_adapter", "risk_scorer", "risk_decision", "risk_router", "risk_stream")


def bytes_input(name: str, rows: list[bytes]) -> http.InferInput:
    tensor = http.InferInput(name, [len(rows), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(rows, dtype=object).reshape(-1, 1))
    return tensor


def array_input(name: str, array: np.ndarray) -> http.InferInput:
    tensor = http.InferInput(name, list(array.shape), http.np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def serve_each_python_model(server, records: list[dict]) -> None:
    payloads = [json.dumps(r).encode() for r in records]
    client = http.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        adapted = client.infer("skill_adapter", [bytes_input("payload", payloads)])
        categorical, numeric = adapted.as_numpy("categorical"), adapted.as_numpy("numeric")
        scored = client.infer("risk_scorer", [array_input("categorical", categorical),
                                              array_input("numeric", numeric)])
        probability = scored.as_numpy("probability")
        decided = client.infer("risk_decision", [array_input("probability", probability)])
        assert decided.as_numpy("decision").shape[0] == len(records)
        routed = client.infer("risk_router", [bytes_input("payload", payloads)])
        assert routed.as_numpy("served_by").shape[0] == len(records)
    finally:
        client.close()
    streamed = stream_client.run_stream(server.grpc_url, "clean-stop", records, range(len(records)))
    assert streamed.complete and [a.status for a in streamed.answers] == ["OK"] * len(records)


def crash_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if CRASH.search(line)]


def wait_for_line(log_path, pattern: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pattern not in log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {pattern!r} in the log within {timeout_s:.0f} s"
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_python_models_unload_without_a_crash_on_reload_and_on_sigterm(built_artifacts, german_credit_data,
                                                                      tmp_path):
    records = [{"features": f} for f in german_credit_data.records()[:8]]
    log_path = tmp_path / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log_path=log_path, model_control_mode="explicit",
                           admin_key=KEY)
    with serving(server):
        serve_each_python_model(server, records)
        admin = http.InferenceServerClient(server.http_url)
        try:
            for model in PYTHON_MODELS:
                # Explicit mode loads an unchanged model only once: unloading it first brings a new stub.
                admin.unload_model(model, headers=admin_headers(KEY))
                wait_for_line(log_path, f"successfully unloaded '{model}'")
                admin.load_model(model, headers=admin_headers(KEY))
        finally:
            admin.close()
        assert crash_lines(log_path.read_text(errors="replace")) == [], "a stub crashed when its model was reloaded"
        serve_each_python_model(server, records)
    log = log_path.read_text(errors="replace")
    assert "successfully unloaded 'risk_stream'" in log.split("Signal (15) received")[-1], "the server did not stop"
    assert crash_lines(log) == [], "a stub crashed when the server stopped"
