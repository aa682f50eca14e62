import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.clients.stream_client import Answer, StreamResult, parse_status, plan, summarize


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 200), st.floats(0, 1), st.integers(0, 12), st.integers(0, 2**32))
def test_a_shuffled_record_never_gets_more_than_the_window_ahead(n, shuffle, window, seed):
    order = plan(n, shuffle=shuffle, window=window, rng=random.Random(seed))
    assert sorted(order) == list(range(n))
    sent, lowest_unsent = set(), 0
    for sequence_id in order:
        while lowest_unsent in sent:
            lowest_unsent += 1
        # Below this id, the lowest one not sent yet waits for it: this id is at most the window ahead of it.
        assert lowest_unsent >= sequence_id or sequence_id - lowest_unsent <= window
        sent.add(sequence_id)


def test_plan_without_perturbation_is_the_natural_order():
    assert plan(5, rng=random.Random(1)) == [0, 1, 2, 3, 4]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.floats(0, 0.5), st.floats(0, 0.5), st.integers(0, 2**32))
def test_lost_records_are_never_sent_and_duplicates_come_after_their_original(n, duplicate, loss, seed):
    order = plan(n, shuffle=0.0, window=5, duplicate=duplicate, loss=loss, rng=random.Random(seed))
    assert set(order) <= set(range(n))
    for sequence_id in set(order):
        assert order.count(sequence_id) <= 2
    # Without shuffling the originals keep their order and a copy never comes before its original, so the first
    # sending of each id is in increasing order.
    firsts = sorted(set(order), key=order.index)
    assert firsts == sorted(firsts)
    if loss == 0.0:
        assert set(order) == set(range(n))


@pytest.mark.parametrize("status, sequence_id, parsed", [
    ("OK", 4, ("OK", 4)), ("LATE", 2, ("LATE", 2)), ("DUPLICATE", 2, ("DUPLICATE", 2)), ("GAP 3-3", 3, ("GAP", 3)), ("GAP 7-16", 7, ("GAP", 16)),
])
def test_status_names_the_ids_of_a_gap(status, sequence_id, parsed):
    assert parse_status(status, sequence_id) == parsed


def test_a_gap_whose_first_id_differs_from_its_sequence_id_is_refused():
    with pytest.raises(ValueError):
        parse_status("GAP 3-5", 4)


def test_summary_counts_statuses_drops_and_order():
    good = StreamResult("a", sent=[0, 2, 1, 1], finals=4, complete=True, answers=[
        Answer("OK", 0, 0, 0.1, "APPROVE", 0.010), Answer("OK", 1, 1, 0.2, "APPROVE", 0.020),
        Answer("OK", 2, 2, 0.3, "APPROVE", 0.030)])
    shuffled = StreamResult("b", sent=[1, 3, 0], finals=3, complete=True, errors=["sequence_id 3: bad"], answers=[
        Answer("GAP", 0, 0, float("nan"), "", 0.0), Answer("OK", 1, 1, 0.5, "REVIEW", 0.040),
        Answer("LATE", 0, 0, 0.6, "REVIEW", 0.050)])
    answered_duplicate = StreamResult("c", sent=[0, 0], finals=2, complete=True, answers=[
        Answer("OK", 0, 0, 0.1, "APPROVE", 0.010), Answer("DUPLICATE", 0, 0, float("nan"), "", 0.001)])
    summary = summarize([good, shuffled, answered_duplicate], seconds=2.0)
    assert (summary.sent, summary.ok, summary.late, summary.gap_ids, summary.errors) == (9, 5, 1, 1, 1)
    assert summary.duplicates == 1 and summary.dropped == 1
    assert summary.in_order_rate == 1.0 and summary.exactly_once
    assert summary.latency_ms["p50"] == pytest.approx(20.0)
    assert summary.throughput == 4.5
    assert "in-order rate 1.0000" in summary.table()


def test_summary_notices_answers_out_of_order_or_twice():
    bad = StreamResult("a", sent=[0, 1], finals=2, answers=[
        Answer("OK", 1, 1, 0.1, "APPROVE", 0.01), Answer("OK", 0, 0, 0.1, "APPROVE", 0.01),
        Answer("OK", 0, 0, 0.1, "APPROVE", 0.01)])
    summary = summarize([bad], seconds=1.0)
    assert summary.in_order_rate == 0.0 and not summary.exactly_once
