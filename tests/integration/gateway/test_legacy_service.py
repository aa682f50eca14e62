"""`s2t legacy serve`: the legacy service itself, TensorFlow behind the unchanged Skill protocol."""
import signal
import threading
import time

import grpc
import numpy as np
import pytest

from s2t.backends.scoring.decision_policy import decide
from s2t.wire import skill_pb2, skill_pb2_grpc
from tests.conftest import SAVED_MODEL, free_port
from tests.integration.skill_services import skill_records, start, stop
from s2t.gate import parity

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def legacy_port(built_artifacts):
    port = free_port()
    process, _ = start(["legacy", "serve", "--port", str(port), "--saved-model", str(SAVED_MODEL)], "listening")
    yield port
    assert stop(process) == 0


def test_legacy_service_scores_like_the_saved_model_in_windows_of_128(legacy_port, german_credit_data, legacy_scores,
                                                                       decision_thresholds):
    rows = np.arange(500)
    with grpc.insecure_channel(f"localhost:{legacy_port}") as channel:
        result = skill_pb2_grpc.SkillStub(channel).Score(iter(skill_records(german_credit_data, rows)), timeout=120)
    assert (result.window_size, result.windows) == (128, 4)
    assert [r.request_id for r in result.results] == [f"legacy-{i}" for i in rows]
    assert [r.window for r in result.results] == (rows // 128).tolist()
    assert all(r.status == skill_pb2.OK and r.error == "" for r in result.results)
    served = np.array([r.probability for r in result.results])
    assert parity.compare("legacy service", legacy_scores[rows], served, TOLERANCE).rows_over_tolerance == 0
    assert [r.decision.encode() for r in result.results] == \
        decide(served.astype(np.float32), decision_thresholds).tolist()


def test_legacy_service_answers_a_bad_record_with_its_field_and_scores_its_window_mates(legacy_port,
                                                                                     german_credit_data):
    records = skill_records(german_credit_data, range(10))
    del records[2].features["purpose"]
    records[5].features["credit_amount"].string_value = "1169"
    records[7].features["age_in_years"].number_value = float("nan")
    with grpc.insecure_channel(f"localhost:{legacy_port}") as channel:
        result = skill_pb2_grpc.SkillStub(channel).Score(iter(records), timeout=60)
    errors = {i: r.error for i, r in enumerate(result.results) if r.status == skill_pb2.INVALID_RECORD}
    assert errors == {2: "features.purpose: missing", 5: "features.credit_amount: expected a number, got string",
                      7: "features.age_in_years: not a finite float32 number (nan)"}
    assert all(r.status == skill_pb2.OK and r.decision for i, r in enumerate(result.results) if i not in errors)


def test_legacy_service_says_once_that_it_listens_and_stops_on_sigterm_after_calls_in_flight(german_credit_data):
    port = free_port()
    process, line = start(["legacy", "serve", "--port", str(port), "--saved-model", str(SAVED_MODEL),
                           "--window-size", "16"], "listening")
    assert f"port {port}" in line and "windows of 16" in line
    # A first call warms TensorFlow up (its first window traces the graph). Then 64 records, SIGTERM sent once the
    # client has sent two windows: the rest of the call (two more windows of records, sent after the signal, and
    # all four scored) ends inside the 10 s the service gives calls in flight, even on a machine loaded by other work.
    records = skill_records(german_credit_data, range(64))

    def records_with_sigterm_after_the_second_window():
        for i, record in enumerate(records):
            if i == 32:
                process.send_signal(signal.SIGTERM)
            yield record

    with grpc.insecure_channel(f"localhost:{port}") as channel:
        stub = skill_pb2_grpc.SkillStub(channel)
        assert len(stub.Score(iter(records[:16]), timeout=60).results) == 16
        result = stub.Score(records_with_sigterm_after_the_second_window(), timeout=60)
    assert stop(process) == 0
    assert len(result.results) == 64 and all(r.status == skill_pb2.OK for r in result.results)


def test_legacy_service_refuses_a_mebibyte_record_at_the_edge_and_answers_a_big_one_on_its_own(legacy_port,
                                                                                             german_credit_data):
    records = skill_records(german_credit_data, range(4))
    records[1].features["purpose"].string_value = "x" * 70_000
    huge = skill_records(german_credit_data, [0])[0]
    huge.features["purpose"].string_value = "x" * 2**20
    with grpc.insecure_channel(f"localhost:{legacy_port}") as channel:
        stub = skill_pb2_grpc.SkillStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Score(iter([records[0], huge, records[2]]), timeout=60)
        result = stub.Score(iter(records), timeout=60)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in refused.value.details()
    assert [r.status for r in result.results] == [skill_pb2.OK, skill_pb2.INVALID_RECORD, skill_pb2.OK, skill_pb2.OK]
    assert result.results[1].error.startswith("payload: ") and "over the limit of 65536" in result.results[1].error


def test_legacy_service_ends_a_call_past_its_timeout_and_refuses_calls_over_its_cap(german_credit_data):
    port, timeout_s = free_port(), 3
    process, _ = start(["legacy", "serve", "--port", str(port), "--saved-model", str(SAVED_MODEL),
                        "--call-timeout-s", str(timeout_s), "--max-calls", "2"], "listening")
    release = threading.Event()

    def idle():
        yield skill_records(german_credit_data, [0])[0]
        release.wait(30)

    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            started = time.monotonic()
            held = [stub.Score.future(idle(), timeout=30) for _ in range(2)]
            time.sleep(0.5)
            with pytest.raises(grpc.RpcError) as over_cap:
                stub.Score(iter(skill_records(german_credit_data, range(3))), timeout=10)
            ended = []
            for call in held:
                with pytest.raises(grpc.RpcError) as err:
                    call.result(timeout=30)
                ended.append(err.value)
            took = time.monotonic() - started
            release.set()
            result = stub.Score(iter(skill_records(german_credit_data, range(3))), timeout=30)
    finally:
        release.set()
        assert stop(process) == 0
    assert over_cap.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "longer than 3 s" in e.details() for e in ended)
    assert timeout_s - 0.5 < took < timeout_s + 10
    assert [r.status for r in result.results] == [skill_pb2.OK] * 3
