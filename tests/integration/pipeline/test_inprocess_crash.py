"""A crash or a hang in risk_pipeline's Python, which the in-process backend runs inside the server process, against
servers of their own (S2T_FAULT_POINTS): a SIGSEGV ends the server and leaves faulthandler's Python stacks in its log
before Triton's own crash report; an execution that never returns shows on /metrics as the start of the execution
in progress, while the server still answers its health checks and its other models."""
from __future__ import annotations

import http.client
import json
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from s2t.backends.runtime import fault_points
from s2t.prometheus_text import samples_named, scrape
from tests.conftest import MODEL_REPOSITORY
from tests.integration.servers import triton_server

MODELS = ("risk_pipeline", "risk_scorer", "skill_adapter")
GAUGE = "s2t_execute_started_seconds"


def server_with(tmp_path: Path, monkeypatch, points: str):
    repo = tmp_path / "model_repository"
    for name in MODELS:
        shutil.copytree(MODEL_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv(fault_points.ENVIRONMENT_VARIABLE, points)
    return triton_server([repo], tmp_path / "triton.log", model_control_mode="explicit").start()


def payload(german_credit_data, i: int = 0) -> bytes:
    return json.dumps({"features": german_credit_data.records()[i]}).encode()


def send(port: int, record: bytes) -> http.client.HTTPConnection:
    """A risk_pipeline request sent and not waited for: its connection, to close when done with it."""
    body = json.dumps({"inputs": [{"name": "payload", "shape": [1, 1], "datatype": "BYTES",
                                   "data": [record.decode()]}]})
    connection = http.client.HTTPConnection("localhost", port, timeout=60)
    connection.request("POST", "/v2/models/risk_pipeline/infer", body)
    return connection


def execute_started(metrics_port: int) -> float:
    [(labels, value)] = samples_named(scrape(f"http://localhost:{metrics_port}/metrics"), GAUGE)
    assert labels == {"model": "risk_pipeline", "version": "1", "instance": "risk_pipeline_0_0"}
    return value


def test_a_segfault_in_the_models_python_ends_the_server_and_leaves_the_python_stack_in_its_log(
        tmp_path, monkeypatch, german_credit_data):
    server = server_with(tmp_path, monkeypatch, "risk_pipeline.execute=segv:0.3")
    try:
        record = payload(german_credit_data)
        deadline = time.monotonic() + 60
        while server.process.poll() is None and time.monotonic() < deadline:
            try:
                send(server.http_port, record).getresponse().read()
            except (OSError, http.client.HTTPException):
                pass
        assert server.process.wait(timeout=30) == -signal.SIGSEGV
    finally:
        server.process.kill()
        server.stop()
    log = (tmp_path / "triton.log").read_text(errors="replace")
    faulthandler_at = log.index("Fatal Python error: Segmentation fault")
    stack = log[faulthandler_at:]
    assert 'fault_points.py", line' in stack and "in _segv" in stack
    assert 'inprocess.py", line' in stack and "in execute" in stack
    assert "Signal (11) received." in stack, "Triton's own handler ran after faulthandler's"


def test_a_hung_execution_shows_its_start_on_metrics_while_the_server_and_other_models_still_answer(
        tmp_path, monkeypatch, german_credit_data):
    server = server_with(tmp_path, monkeypatch, "risk_pipeline.execute=hang")
    try:
        assert execute_started(server.metrics_port) == 0
        sent_at = time.time()
        stuck = send(server.http_port, payload(german_credit_data))
        deadline = time.monotonic() + 30
        while (started := execute_started(server.metrics_port)) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sent_at - 1 <= started <= time.time()
        time.sleep(2)
        assert execute_started(server.metrics_port) == started
        with urllib.request.urlopen(f"http://localhost:{server.http_port}/v2/health/ready", timeout=10) as ready:
            assert ready.status == 200
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
        tensor = httpclient.InferInput("payload", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload(german_credit_data, 1)]], dtype=object))
        assert client.infer("skill_adapter", [tensor]).as_numpy("numeric").shape == (1, 7)
        assert server.process.poll() is None
        stuck.close()
    finally:
        server.process.kill()
        server.stop()
