"""`s2t gateway`: the unchanged legacy Skill client, through the gateway and Triton, scores as the legacy model did."""
import socket
import subprocess
import time

import grpc
import numpy as np
import pytest

from s2t.backends.scoring.decision_policy import decide
from s2t.clients.legacy_record import to_protobuf
from s2t.gateway.skill_gateway import serve
from s2t.wire import skill_pb2, skill_pb2_grpc
from tests.conftest import S2T, free_port
from s2t.gate import parity

TOLERANCE = 1e-5


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"s2t gateway exited with {process.returncode}: {process.stderr.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    pytest.fail(f"s2t gateway did not listen on {port} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def gateway_port(triton):
    port = free_port()
    process = subprocess.Popen([str(S2T), "gateway", "--port", str(port), "--grpc-url", triton.grpc_url,
                                "--window-size", "32"], stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, process)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def skill_records(german_credit_data, rows):
    records = german_credit_data.records()
    return [to_protobuf({"request_id": f"legacy-{i}", "stream_id": "batch", "sequence_id": i,
                         "event_time_ms": 1_700_000_000_000 + i, "features": records[i]}) for i in rows]


def test_unchanged_legacy_client_through_the_gateway_matches_the_legacy_model(gateway_port, german_credit_data,
                                                                                legacy_scores, decision_thresholds):
    rows = np.arange(1000)
    with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
        result = skill_pb2_grpc.SkillStub(channel).Score(iter(skill_records(german_credit_data, rows)), timeout=300)
    assert (result.window_size, result.windows) == (32, 32)  # 31 full windows and the last 8 records
    assert [r.request_id for r in result.results] == [f"legacy-{i}" for i in rows]
    assert [r.window for r in result.results] == (rows // 32).tolist()
    assert all(r.status == skill_pb2.OK and r.error == "" for r in result.results)
    served = np.array([r.probability for r in result.results])
    comparison = parity.compare("gateway", legacy_scores, served, TOLERANCE)
    assert comparison.rows_over_tolerance == 0, comparison
    assert [r.decision.encode() for r in result.results] == \
        decide(served.astype(np.float32), decision_thresholds).tolist()


def test_bad_record_is_answered_invalid_record_and_its_window_mates_are_scored(gateway_port, german_credit_data):
    records = skill_records(german_credit_data, range(40))
    del records[5].features["purpose"]
    records[33].features["credit_amount"].string_value = "1169"
    with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
        result = skill_pb2_grpc.SkillStub(channel).Score(iter(records), timeout=120)
    bad = {i: r for i, r in enumerate(result.results) if r.status != skill_pb2.OK}
    assert sorted(bad) == [5, 33]
    assert bad[5].status == skill_pb2.INVALID_RECORD and bad[5].error == "features.purpose: missing"
    assert bad[33].error == "features.credit_amount: expected a number, got string"
    assert all(0.0 <= r.probability <= 1.0 and r.decision for i, r in enumerate(result.results) if i not in bad)


def test_gateway_fails_the_call_unavailable_when_triton_is_unreachable():
    port = free_port()
    server = serve(port, f"localhost:{free_port()}", window_size=4)
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                skill_pb2_grpc.SkillStub(channel).Score(iter([skill_pb2.SkillRecord(request_id="r")]), timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "scoring window 0 failed" in err.value.details()
    finally:
        server.stop(grace=None)


def test_gateway_fails_the_call_unavailable_when_the_model_is_not_served(triton):
    port = free_port()
    server = serve(port, triton.grpc_url, model="no_such_model")
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                skill_pb2_grpc.SkillStub(channel).Score(iter([skill_pb2.SkillRecord(request_id="r")]), timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)
