"""A stop or a reload of the python models is clean: no stub dies on its way out (faulthandler would print `Fatal
Python error` to the server's log, and an operator could not tell a crash from a stop)."""
import json
import re
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as http

from s2t.clients import stream_client
from s2t.control.live_control import admin_headers
from s2t.prometheus_text import parse_metrics
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server

KEY = "clean-stop-key"
# A stub's faulthandler, the server's signal handler, glibc's heap checks.
CRASH = re.compile(r"Fatal Python error|Segmentation fault|Signal \((6|11)\)|malloc\(\)|free\(\)|Aborted")
# The python models of the repository (risk_scorer runs on backends/runtime/onnxruntime/model.py here).
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


def route_while_the_primary_is_away(server, records: list[dict]) -> None:
    """risk_router's calls to its primary fail (the breaker and the fallback answer): the errors and their
    tracebacks are objects the stub has to be rid of before it ends."""
    client = http.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        for _ in range(3):
            client.infer("risk_router", [bytes_input("payload", [json.dumps(r).encode() for r in records])])
    finally:
        client.close()


def router_rows(server) -> float:
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=10) as resp:
        metrics = parse_metrics(resp.read().decode())
    return sum(value for (name, _), value in metrics.items() if name == "s2t_router_rows_total")


def crash_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if CRASH.search(line)]


def unloads(log_path, model: str) -> int:
    return log_path.read_text(errors="replace").count(f"successfully unloaded '{model}'")


def wait_for_unload(log_path, model: str, before: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while unloads(log_path, model) == before:
        assert time.monotonic() < deadline, f"{model}: not unloaded within {timeout_s:.0f} s"
        time.sleep(0.1)


def reload_each_python_model(server, log_path, records: list[dict]) -> None:
    """Each model twice: unloaded then loaded (a new stub after the old one is gone), and loaded with a changed
    config (Triton starts the new instance, then unloads the old one: both live for a moment)."""
    admin = http.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        for model in PYTHON_MODELS:
            # Explicit mode loads an unchanged model only once: unloading it first brings a new stub.
            before = unloads(log_path, model)
            admin.unload_model(model, headers=admin_headers(KEY))
            wait_for_unload(log_path, model, before)
            if model == "risk_scorer":
                route_while_the_primary_is_away(server, records)
            admin.load_model(model, headers=admin_headers(KEY))
            config = admin.get_model_config(model)
            # A CUDA stream priority: nothing changes on CPU, but a changed config is a new model to Triton.
            config.setdefault("optimization", {})["priority"] = "PRIORITY_MAX"
            admin.load_model(model, config=json.dumps(config), headers=admin_headers(KEY))
            wait_for_unload(log_path, model, before + 1)
    finally:
        admin.close()


@pytest.mark.timeout(300)
def test_python_models_unload_without_a_crash_on_reload_and_on_sigterm(built_artifacts, german_credit_data,
                                                                      tmp_path):
    records = [{"features": f} for f in german_credit_data.records()[:8]]
    log_path = tmp_path / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log_path=log_path, model_control_mode="explicit",
                           admin_key=KEY, stop_gracefully=True)
    with serving(server):
        serve_each_python_model(server, records)
        reload_each_python_model(server, log_path, records)
        # The new instances serve, and count in the metrics they share with the instances they replaced.
        counted = router_rows(server)
        serve_each_python_model(server, records)
        assert router_rows(server) == counted + len(records)
        serve_each_python_model(server, records)
        assert server.process.poll() is None, "tritonserver died"
        assert crash_lines(log_path.read_text(errors="replace")) == [], "a model's reload crashed a process"
    log = log_path.read_text(errors="replace")
    assert "successfully unloaded 'risk_stream'" in log.split("Signal (15) received")[-1], "the server did not stop"
    assert crash_lines(log) == [], "a stub crashed when the server stopped"
