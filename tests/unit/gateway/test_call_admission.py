import pytest

from s2t.gateway.call_admission import (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE, AdmissionLimits,
                                        CallAdmission)
from tests.unit.fake_clock import Clock


def pool(**limits):
    clock = Clock()
    return CallAdmission(AdmissionLimits(**limits), clock), clock


def test_calls_are_admitted_until_the_slots_are_taken_then_refused_at_once_with_when_to_retry():
    admission, clock = pool(slots=2, per_caller=2, reclaim_after_s=0.5)
    first, second = admission.admit("a").ticket, admission.admit("b").ticket
    clock.now += 0.2
    admission.heard(first)
    refused = admission.admit("c").refused
    assert first and second and refused.status == RESOURCE_EXHAUSTED
    assert refused.retry_after_s == pytest.approx(0.3) and "retry in 0.3 s" in refused.message


def test_when_full_the_call_silent_longest_gives_its_slot_to_a_new_caller():
    admission, clock = pool(slots=3, per_caller=3, reclaim_after_s=0.5)
    tickets = [admission.admit(caller).ticket for caller in "abc"]
    clock.now += 2.0
    admission.heard(tickets[0])
    admission.heard(tickets[2])
    clock.now += 0.1
    admitted = admission.admit("d")
    assert admitted.ticket is not None and admitted.reclaimed is tickets[1]
    assert admitted.reclaimed.ending.status == UNAVAILABLE and "without a record" in admitted.reclaimed.ending.message
    assert admission.in_use == 3


def test_a_call_being_scored_is_never_reclaimed_however_long_it_takes():
    admission, clock = pool(slots=1, per_caller=1, reclaim_after_s=0.5)
    working = admission.admit("a").ticket
    admission.closed(working)
    clock.now += 10
    assert admission.admit("b").refused.status == RESOURCE_EXHAUSTED
    assert working.ending is None


@pytest.mark.parametrize("per_caller, held, refused", [(1, 1, True), (2, 1, False), (2, 2, True), (4, 3, False)])
def test_one_connection_holds_at_most_its_share_while_others_are_still_admitted(per_caller, held, refused):
    admission, _ = pool(slots=8, per_caller=per_caller)
    for _ in range(held):
        assert admission.admit("greedy").ticket is not None
    outcome = admission.admit("greedy")
    assert (outcome.refused is not None) == refused
    if refused:
        assert outcome.refused.status == RESOURCE_EXHAUSTED and f"{per_caller} calls in progress" in \
            outcome.refused.message
    assert admission.admit("polite").ticket is not None


def test_a_released_slot_is_free_at_once_and_releasing_twice_frees_it_once():
    admission, _ = pool(slots=1, per_caller=1)
    ticket = admission.admit("a").ticket
    admission.release(ticket)
    admission.release(ticket)
    assert admission.in_use == 0
    again = admission.admit("a").ticket
    assert again is not None and admission.admit("b").refused is not None


@pytest.mark.parametrize("silent_s, elapsed_s, receiving, ending", [
    (0.5, 0.5, True, None),
    (5.1, 5.1, True, "no record for 5 s"),
    (5.1, 5.1, False, None),  # all records in, being scored: not idle
    (0.1, 60.5, True, "longer than 60 s"),
    (0.1, 60.5, False, "longer than 60 s"),
])
def test_overdue_names_calls_past_the_call_timeout_or_silent_past_the_idle_timeout(silent_s, elapsed_s, receiving,
                                                                                   ending):
    admission, clock = pool(call_timeout_s=60, idle_timeout_s=5)
    ticket = admission.admit("a").ticket
    if not receiving:
        admission.closed(ticket)
    clock.now += elapsed_s - silent_s
    admission.heard(ticket)
    clock.now += silent_s
    due = admission.overdue()
    if ending is None:
        assert due == [] and ticket.ending is None
    else:
        assert due == [ticket] and ticket.ending.status == DEADLINE_EXCEEDED and ending in ticket.ending.message
        assert admission.overdue() == []  # named once


@pytest.mark.parametrize("limits", [dict(slots=0), dict(slots=2, per_caller=3), dict(per_caller=0),
                                    dict(idle_timeout_s=0), dict(reclaim_after_s=-1)])
def test_limits_that_cannot_work_are_refused(limits):
    with pytest.raises(ValueError):
        AdmissionLimits(**limits)


def test_with_a_share_of_every_slot_a_full_pool_still_reclaims_a_silent_call_of_the_same_connection():
    admission, clock = pool(slots=2, per_caller=2, reclaim_after_s=0.5)
    first = admission.admit("one").ticket
    admission.admit("one")
    clock.now += 1
    admitted = admission.admit("one")
    assert admitted.ticket is not None and admitted.reclaimed is first
