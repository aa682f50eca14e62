"""`s2t serve` as a user runs it: ports from the environment, readiness, SIGTERM drains in-flight requests."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from s2t.serve.leftovers import SHM_DIR, regions_of
from tests.conftest import ROOT, S2T, free_port



def children(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def wait_for_line(log: Path, text: str, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture
def serve_process(built_artifacts, tmp_path):
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port()}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    log = open(tmp_path / "serve.log", "wb")
    process = subprocess.Popen([str(S2T), "serve", "--exit-timeout", "10"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://localhost:{ports['HTTP_PORT']}/v2/health/ready", timeout=1):
                break
        except OSError:
            time.sleep(0.3)
    else:
        process.kill()
        pytest.fail("s2t serve was not ready within 120 s")
    yield process, ports, tmp_path / "serve.log"
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    log.close()


def test_serve_takes_ports_from_the_environment_and_prints_the_endpoints(serve_process, german_credit_data):
    process, ports, log = serve_process
    body = json.dumps({"inputs": [{"name": "payload", "shape": [1, 1], "datatype": "BYTES",
                                   "data": [json.dumps({"features": german_credit_data.records()[3]})]}]}).encode()
    with urllib.request.urlopen(urllib.request.Request(
            f"http://localhost:{ports['HTTP_PORT']}/v2/models/risk_pipeline/infer", data=body), timeout=30) as resp:
        assert {o["name"] for o in json.load(resp)["outputs"]} == {"probability", "decision"}
    with urllib.request.urlopen(f"http://localhost:{ports['METRICS_PORT']}/metrics", timeout=10) as resp:
        metrics = resp.read()
    assert b'nv_inference_request_success{model="risk_pipeline"' in metrics
    # No latency summaries unless asked for (--latency-summaries): Triton updates them for every request on the
    # model's thread, which the hot path pays for; the counters are always there.
    assert b'nv_inference_request_duration_us{model="risk_pipeline"' in metrics
    assert b"nv_inference_request_summary_us" not in metrics
    assert wait_for_line(log, f"ready: HTTP localhost:{ports['HTTP_PORT']}")
    # No admin key set: logging, trace and shared memory answer nobody.
    for path, body in (("/v2/logging", b'{"log_verbose_level": 1}'), ("/v2/trace/setting", b"{}"),
                       ("/v2/systemsharedmemory/region/x/register", b'{"key": "/x", "offset": 0, "byte_size": 8}')):
        request = urllib.request.Request(f"http://localhost:{ports['HTTP_PORT']}{path}", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 403 and b"restricted" in refused.value.read(), path


def test_sigterm_lets_in_flight_requests_finish_and_stops_every_child(serve_process, german_credit_data):
    process, ports, log = serve_process
    server_pids = children(process.pid)
    assert len(server_pids) >= 4, "expected tritonserver and its python stubs"
    regions = regions_of(server_pids)
    assert regions
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:256]]
    payload = np.array(records, dtype=object).reshape(-1, 1)
    client = http.InferenceServerClient(f"localhost:{ports['HTTP_PORT']}", concurrency=12, network_timeout=60)
    pending = []
    for _ in range(24):
        tensor = http.InferInput("payload", list(payload.shape), "BYTES")
        tensor.set_data_from_numpy(payload)
        # Bulk priority: 6,000 records queue for seconds, past the interactive queue timeout by design.
        pending.append(client.async_infer("risk_pipeline", [tensor], priority=2))
    time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    results = [p.get_result() for p in pending]
    client.close()
    assert all(r.as_numpy("probability").shape == (256, 1) for r in results)
    assert process.wait(60) == 0, log.read_text()[-3000:]
    assert wait_for_line(log, "draining in-flight requests", timeout=1)
    # Triton saw the requests still open when the signal came, and waited for them.
    assert re.search(r"Found [1-9][0-9]* HTTP service connections", log.read_text())
    assert not [pid for pid in server_pids if alive(pid)]
    assert not [name for name in regions if (SHM_DIR / name).exists()]
