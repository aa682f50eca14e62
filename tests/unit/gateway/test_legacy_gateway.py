import asyncio

import grpc
import numpy as np
import pytest

from s2t.gateway.call_admission import AdmissionLimits, CallAdmission
from s2t.backends.runtime.serving_errors import INTERNAL, INVALID, UNAVAILABLE, of_kind
from s2t.clients.legacy_record import to_protobuf
from s2t.gateway.skill_gateway import CallLimits, SkillGateway, TritonWindows, check_window_size
from s2t.gateway.triton_infer import error_kind
from s2t.wire import skill_pb2
from s2t.wire.skill_call import CallRefused


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self, peer="ipv4:127.0.0.1:1"):
        self._peer = peer

    def peer(self):
        return self._peer

    async def abort(self, code, details, trailing_metadata=()):
        raise Aborted(code, details, dict(trailing_metadata))


def scorer_failing_on(bad: set[int], kind=INVALID):
    async def score(payloads):
        records = [skill_pb2.SkillRecord.FromString(p) for p in payloads]
        if any(r.sequence_id in bad for r in records):
            raise of_kind(kind, "features.purpose: missing")
        return (np.array([[r.sequence_id / 100] for r in records], dtype=np.float32),
                np.array([[b"REVIEW"]] * len(records), dtype=object))
    return score


def records(n):
    return [to_protobuf({"request_id": f"r-{i}", "sequence_id": i, "features": {"x": 1}}).SerializeToString()
            for i in range(n)]


async def arriving(items):
    for item in items:
        yield item


def score(gateway, items, context=None):
    reply = asyncio.run(gateway.score(arriving(items), context or FakeContext()))
    return skill_pb2.SkillBatchResult.FromString(reply)


def gateway_with(scorer, window_size=3, **options):
    return SkillGateway(TritonWindows(scorer, window_size), window_size, **options)


@pytest.mark.parametrize("status, kind", [
    (grpc.StatusCode.INVALID_ARGUMENT, INVALID), (grpc.StatusCode.UNAVAILABLE, UNAVAILABLE),
    (grpc.StatusCode.DEADLINE_EXCEEDED, UNAVAILABLE), (grpc.StatusCode.NOT_FOUND, UNAVAILABLE),
    (grpc.StatusCode.INTERNAL, INTERNAL), (grpc.StatusCode.UNKNOWN, INTERNAL), (None, INTERNAL),
])
def test_triton_status_maps_to_what_it_means_for_a_legacy_caller(status, kind):
    assert error_kind(status) == kind


@pytest.mark.parametrize("in_flight", [1, 2, 4])
def test_gateway_answers_every_record_in_order_with_its_window(in_flight):
    result = score(gateway_with(scorer_failing_on(set()), windows_in_flight=in_flight), records(7))
    assert (result.windows, result.window_size) == (3, 3)
    assert [r.request_id for r in result.results] == [f"r-{i}" for i in range(7)]
    assert [r.window for r in result.results] == [0, 0, 0, 1, 1, 1, 2]
    assert all(r.status == skill_pb2.OK and r.decision == "REVIEW" for r in result.results)
    assert result.results[5].probability == pytest.approx(0.05)


def test_bad_record_is_answered_invalid_record_and_its_window_mates_are_scored():
    result = score(gateway_with(scorer_failing_on({4})), records(6))
    statuses = [r.status for r in result.results]
    assert statuses == [skill_pb2.OK] * 4 + [skill_pb2.INVALID_RECORD, skill_pb2.OK]
    assert result.results[4].error == "features.purpose: missing" and result.results[4].decision == ""


def test_a_record_over_the_record_cap_is_answered_invalid_record_and_never_sent():
    sent = []

    async def scorer(payloads):
        sent.extend(payloads)
        return await scorer_failing_on(set())(payloads)

    big = to_protobuf({"request_id": "big", "sequence_id": 1, "features": {"x": "y" * 70_000}}).SerializeToString()
    result = score(gateway_with(scorer), [records(1)[0], big, records(3)[2]])
    assert [r.status for r in result.results] == [skill_pb2.OK, skill_pb2.INVALID_RECORD, skill_pb2.OK]
    assert result.results[1].error == f"payload: {len(big)} bytes is over the limit of 65536"
    assert result.results[1].request_id == "big" and big not in sent and len(sent) == 2


def test_bytes_that_are_no_record_fail_the_call_invalid_argument_naming_the_record():
    with pytest.raises(Aborted) as err:
        score(gateway_with(scorer_failing_on(set())), records(4) + [b"\xff\xff\xff\xff"])
    assert err.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert "record 4 of the call is not a skill.SkillRecord" in err.value.args[1]


def test_a_window_goes_to_triton_before_its_records_are_parsed_and_is_called_back_when_one_is_no_record():
    # The parse for ids runs while Triton scores: it is not on the call's path between its last record and Triton.
    started, cancelled = [], []

    async def scorer(payloads):
        started.append(len(payloads))
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(len(payloads))
            raise

    async def call():
        windows = TritonWindows(scorer, window_size=3)
        with pytest.raises(CallRefused) as err:
            await windows(records(2) + [b"\xff\xff\xff\xff"], 1)
        await asyncio.sleep(0)  # the cancelled request's own handling
        return err.value

    refused = asyncio.run(asyncio.wait_for(call(), timeout=5))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "record 5 of the call is not a skill.SkillRecord" in refused.details
    assert started == [3] and cancelled == [3]


@pytest.mark.parametrize("ids, sizes", [
    (["a", "", "c-" + "x" * 200], [10, 70_000, 10]),
    (["r-0", "r-1", "r-2"], [70_000, 70_000, 70_000]),
])
def test_results_echo_each_records_ids_and_window_in_place_with_oversized_records_mixed_in(ids, sizes):
    window = [to_protobuf({"request_id": rid, "sequence_id": n, "features": {"x": "y" * size}}).SerializeToString()
              for n, (rid, size) in enumerate(zip(ids, sizes))]
    results = asyncio.run(TritonWindows(scorer_failing_on(set()), window_size=3)(window, 4))
    assert [(r.request_id, r.sequence_id, r.window) for r in results] == [(rid, n, 4) for n, rid in enumerate(ids)]
    assert [r.status for r in results] == [skill_pb2.OK if size < 65_536 else skill_pb2.INVALID_RECORD
                                          for size in sizes]
    assert all(r.probability == pytest.approx(n / 100) for n, r in enumerate(results) if r.status == skill_pb2.OK)


@pytest.mark.parametrize("kind, code", [(UNAVAILABLE, grpc.StatusCode.UNAVAILABLE), (INTERNAL, grpc.StatusCode.INTERNAL)])
def test_a_triton_failure_fails_the_legacy_call_with_the_matching_status(kind, code):
    gateway = gateway_with(scorer_failing_on({1}, kind))
    with pytest.raises(Aborted) as err:
        score(gateway, records(3))
    assert err.value.args[0] == code and "window 0" in err.value.args[1]


def test_window_size_must_be_positive():
    with pytest.raises(ValueError, match="window_size"):
        gateway_with(scorer_failing_on(set()), window_size=0)


def test_a_call_past_the_record_limit_is_refused():
    gateway = gateway_with(scorer_failing_on(set()), limits=CallLimits(max_records=4))
    with pytest.raises(Aborted) as err:
        score(gateway, records(5))
    assert err.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT and "at most 4 records" in err.value.args[1]


def test_a_call_over_the_slots_is_refused_resource_exhausted_with_when_to_retry():
    admission = CallAdmission(AdmissionLimits(slots=1, per_caller=1))
    admission.admit("ipv4:10.0.0.1:5")  # a call that just started, still sending
    with pytest.raises(Aborted) as err:
        score(gateway_with(scorer_failing_on(set()), admission=admission), records(2), FakeContext("other"))
    code, details, metadata = err.value.args
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry in" in details
    assert 0 < int(metadata["retry-after-ms"]) <= 500


def test_every_slot_is_free_again_once_calls_end_answered_or_refused():
    admission = CallAdmission(AdmissionLimits(slots=2, per_caller=2))
    gateway = gateway_with(scorer_failing_on({1}, UNAVAILABLE), admission=admission)
    score(gateway, records(1))
    with pytest.raises(Aborted):
        score(gateway, records(3))
    assert admission.in_use == 0


@pytest.mark.parametrize("window, max_batch, ok", [(32, 256, True), (256, 256, True), (257, 256, False),
                                                   (1, 0, True), (2, 0, False), (0, 256, False)])
def test_window_size_must_fit_the_models_max_batch_size(window, max_batch, ok):
    if ok:
        check_window_size(window, max_batch, "risk_pipeline")
    else:
        with pytest.raises(ValueError, match="window"):
            check_window_size(window, max_batch, "risk_pipeline")


def test_a_reply_over_its_byte_limit_fails_the_call_instead_of_being_sent():
    gateway = gateway_with(scorer_failing_on(set()), limits=CallLimits(max_reply_bytes=100))
    with pytest.raises(Aborted) as err:
        score(gateway, records(7))
    assert err.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT and "over 100 bytes" in err.value.args[1]


def test_nothing_on_the_gateways_path_imports_tensorflow():
    """The gateway must accept calls within a second of its launch: TensorFlow alone takes longer to import."""
    import subprocess
    import sys
    code = ("import sys, s2t.cli, s2t.gateway.skill_gateway, s2t.gateway.triton_infer, s2t.gateway.dual_run; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf2onnx')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout.strip() == "[]"
