"""Hostile records through `s2t gateway`, mixed with valid ones, from concurrent callers: every valid record is scored
as the legacy model scores it, every bad one gets its own error naming the field, and the gateway and Triton keep
serving (same processes, still ready)."""
import random
from concurrent import futures

import grpc
import numpy as np
import pytest

from s2t.wire import skill_pb2, skill_pb2_grpc
from tests.conftest import free_port
from tests.integration.skill_services import running, skill_records

TOLERANCE = 1e-5
CALLERS = 6  # under the gateway's cap of 8 concurrent calls
RECORDS_PER_CALL = 200
CALLS = 12


def mutations(categorical: list[str], numeric: list[str]):
    """(name, mutate(record, rng) -> expected error prefix, or None when the record stays valid)."""
    def drop(record, rng):
        name = rng.choice(categorical + numeric)
        del record.features[name]
        return f"features.{name}: missing"

    def number_for_category(record, rng):
        name = rng.choice(categorical)
        record.features[name].number_value = 3.0
        return f"features.{name}: expected a string, got number"

    def text_for_number(record, rng):
        name = rng.choice(numeric)
        record.features[name].string_value = "12"
        return f"features.{name}: expected a number, got string"

    def bool_for_number(record, rng):
        name = rng.choice(numeric)
        record.features[name].bool_value = True
        return f"features.{name}: expected a number, got boolean"

    def non_finite(record, rng):
        name = rng.choice(numeric)
        record.features[name].number_value = rng.choice([float("nan"), float("inf"), -float("inf"), 1e300])
        return f"features.{name}: not a finite float32 number"

    def no_features(record, rng):
        record.ClearField("features")
        return "features."

    def oversized(record, rng):
        record.request_id = record.request_id + "-" + "x" * 70_000
        return "payload: "

    def unset_value(record, rng):
        name = rng.choice(categorical + numeric)
        record.features[name].Clear()
        return f"features.{name}: missing"

    def extra_attributes(record, rng):  # valid: attributes the model does not take are ignored
        for i in range(50):
            record.features[f"extra_{i}"].string_value = "\u00e9\u2603" * 20
        return None

    def odd_envelope(record, rng):  # valid: the gateway does not order records
        record.sequence_id = rng.choice([-1, 2**63 - 1, -2**63])
        record.stream_id = "\u2603" * 100
        return None

    return [drop, number_for_category, text_for_number, bool_for_number, non_finite, no_features, oversized,
            unset_value, extra_attributes, odd_envelope]


@pytest.fixture(scope="module")
def gateway_port(triton):
    port = free_port()
    with running(["gateway", "--port", str(port), "--grpc-url", triton.grpc_url, "--window-size", "32"],
                 "ready") as process:
        yield port
        assert process.poll() is None, "the gateway died under hostile input"


def test_hostile_records_mixed_with_valid_ones_each_get_their_own_answer_and_nothing_goes_down(
        triton, gateway_port, german_credit_data, legacy_scores):
    rng = random.Random(20261201)
    pid_before = triton.process.pid
    data = german_credit_data
    kinds = mutations(sorted(data.categorical), sorted(data.numeric))
    calls = []
    for call in range(CALLS):
        rows = [rng.randrange(len(data)) for _ in range(RECORDS_PER_CALL)]
        records = skill_records(data, rows, prefix=f"c{call}")
        expected = []
        for record, row in zip(records, rows):
            error = rng.choice(kinds)(record, rng) if rng.random() < 0.4 else None
            expected.append((row, error))
        calls.append((records, expected))

    def send(records):
        with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
            return skill_pb2_grpc.SkillStub(channel).Score(iter(records), timeout=120)

    with futures.ThreadPoolExecutor(CALLERS) as pool:
        answers = list(pool.map(send, [records for records, _ in calls]))

    valid = bad = 0
    for (records, expected), answer in zip(calls, answers):
        assert [r.request_id for r in answer.results] == [r.request_id for r in records]
        for (row, error), result in zip(expected, answer.results):
            if error is None:
                valid += 1
                assert result.status == skill_pb2.OK, result.error
                assert abs(result.probability - legacy_scores[row]) <= TOLERANCE
            else:
                bad += 1
                assert result.status == skill_pb2.INVALID_RECORD and result.error.startswith(error), \
                    (error, result.error)
                assert result.decision == ""
    assert valid > 1000 and bad > 500
    assert triton.process.pid == pid_before and triton.process.poll() is None
    import tritonclient.grpc as grpcclient
    assert grpcclient.InferenceServerClient(triton.grpc_url).is_model_ready("risk_pipeline")


def test_bytes_that_are_no_skill_record_fail_that_call_alone(gateway_port, german_credit_data, legacy_scores):
    with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
        raw = channel.stream_unary("/skill.Skill/Score", request_serializer=None,
                                   response_deserializer=skill_pb2.SkillBatchResult.FromString)
        with pytest.raises(grpc.RpcError) as refused:
            raw(iter([b"\xff\xff\xff\xff", b"\x0a\x05ab"]), timeout=30)
        assert refused.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        result = skill_pb2_grpc.SkillStub(channel).Score(iter(skill_records(german_credit_data, range(5))), timeout=30)
    assert [r.status for r in result.results] == [skill_pb2.OK] * 5
    assert np.allclose([r.probability for r in result.results], legacy_scores[:5], atol=TOLERANCE)
