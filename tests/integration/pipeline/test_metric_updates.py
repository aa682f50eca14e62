"""Metric updates from python models on the real server: one that Triton would refuse is refused in the model
(backends/runtime/triton_glue.py CheckedMetric) and the server stays up, beside valid traffic. In Triton 2.51's python
backend a refused update reaches the server, which frees its error message while the stub reads and frees it too:
the stub dies of a SIGSEGV holding its shared memory's lock and the server aborts on it, a request or two later."""
from __future__ import annotations

import re
import urllib.request
from concurrent import futures

import numpy as np
import pytest
import tritonclient.http as http

from s2t.prometheus_text import parse_metrics
from tests.integration.servers import serving, triton_server

CRASH = re.compile(r"Fatal Python error|Segmentation fault|Signal \((6|11)\)|lock_exception")
CALLS, VALID_CALLERS, REFUSED_CALLERS = 200, 4, 2

CONFIG = """name: "metric_updates"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# Counts x when x >= 0; a negative x asks for a counter incremented below zero, which Triton refuses. y is x, or
# -1 when the update was refused.
MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils
from s2t.backends.runtime.triton_glue import Glue

glue = Glue(pb_utils, "metric_updates")


class TritonPythonModel:
    def initialize(self, args):
        family = glue.metric_family("s2t_test_counted_total", "x counted", glue.metric_family.COUNTER)
        self.counted = family.Metric(labels={})

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "x").as_numpy()[0])
            try:
                self.counted.increment(x)
                y = x
            except Exception:  # noqa: BLE001 - refused, here or by the server
                y = -1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", np.array([y], np.float32))]))
        return responses

    def finalize(self):
        glue.finalize(self)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("metric_updates")
    model = root / "repository" / "metric_updates"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL)
    with serving(triton_server([root / "repository"], root / "tritonserver.log", grpc_front=False)) as running:
        yield running


def counted(server) -> float:
    with urllib.request.urlopen(f"http://localhost:{server.metrics_port}/metrics", timeout=10) as resp:
        metrics = parse_metrics(resp.read().decode())
    return sum(value for (name, _), value in metrics.items() if name == "s2t_test_counted_total")


def test_metric_updates_triton_would_refuse_beside_valid_ones_leave_the_stub_and_the_server_up(server):
    def call(x: float) -> list[float]:
        client = http.InferenceServerClient(server.http_url, network_timeout=30)
        tensor = http.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([x], np.float32))
        try:
            return [float(client.infer("metric_updates", [tensor]).as_numpy("y")[0]) for _ in range(CALLS)]
        finally:
            client.close()

    with futures.ThreadPoolExecutor(VALID_CALLERS + REFUSED_CALLERS) as pool:
        valid = [pool.submit(call, 2.0) for _ in range(VALID_CALLERS)]
        refused = [pool.submit(call, -1.0) for _ in range(REFUSED_CALLERS)]
        answers = [f.result() for f in valid], [f.result() for f in refused]

    assert answers == ([[2.0] * CALLS] * VALID_CALLERS, [[-1.0] * CALLS] * REFUSED_CALLERS)
    assert server.process.poll() is None
    assert counted(server) == 2.0 * CALLS * VALID_CALLERS
    log = server.log_path.read_text(errors="replace")
    assert [line for line in log.splitlines() if CRASH.search(line)] == []
    assert "can only be incremented" not in log, "a refused update reached the server"
