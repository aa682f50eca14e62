"""s2t/wire/skill_call.py: one Score call's records as they arrive, within the call's limits, and its windows."""
import threading

import grpc
import pytest

from s2t.wire.skill_call import CallRefused, records_within, windows


@pytest.mark.parametrize("n, size, lengths", [(0, 3, []), (2, 3, [2]), (3, 3, [3]), (7, 3, [3, 3, 1]), (4, 1, [1] * 4)])
def test_records_are_cut_into_fixed_windows_and_the_rest(n, size, lengths):
    assert [len(w) for w in windows(range(n), size)] == lengths


def test_records_within_ends_an_idle_caller_deadline_exceeded():
    def idle():
        yield 1
        threading.Event().wait(5)

    received = []
    with pytest.raises(CallRefused) as refused:
        for record in records_within(idle(), timeout_s=0.3, max_records=10):
            received.append(record)
    assert received == [1] and refused.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("n, max_records, refused", [(3, 3, False), (4, 3, True), (0, 1, False)])
def test_records_within_refuses_the_record_past_the_limit(n, max_records, refused):
    if refused:
        with pytest.raises(CallRefused, match=f"at most {max_records} records"):
            list(records_within(iter(range(n)), 5, max_records))
    else:
        assert list(records_within(iter(range(n)), 5, max_records)) == list(range(n))


def test_records_within_passes_on_the_callers_own_failure():
    def broken():
        yield 1
        raise RuntimeError("caller went away")

    with pytest.raises(RuntimeError, match="went away"):
        list(records_within(broken(), 5, 10))
