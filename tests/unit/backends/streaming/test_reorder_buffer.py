import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.streaming.reorder_buffer import (GAP, IN_ORDER, LATE, MAX_SKIPPED_RANGES, BufferFull, ReorderSettings,
                                                   StreamReorder, StreamTable)

SETTINGS = ReorderSettings(max_gap=10, reorder_timeout_ms=200, max_buffered=64)


def answers(emissions):
    """(status, first id, last id) per emission; a GAP's carrier is checked separately."""
    return [(e.status, e.sequence_id, e.last_id) for e in emissions]


def feed(ids, settings=SETTINGS, now_ms=0.0):
    stream = StreamReorder(settings, now_ms)
    out = []
    for i in ids:
        out += stream.offer(i, f"r{i}", now_ms).emissions
    return stream, out


@pytest.mark.parametrize("arrivals, expected", [
    ([0, 1, 2], [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1), (IN_ORDER, 2, 2)]),
    ([1, 0, 2], [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1), (IN_ORDER, 2, 2)]),
    ([2, 1, 0], [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1), (IN_ORDER, 2, 2)]),
    ([0, 0, 1, 1, 0], [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1)]),
    ([2, 2, 0, 1], [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1), (IN_ORDER, 2, 2)]),
    # 11 is 11 ids ahead of 0 (more than max_gap 10): id 0 is given up at once, 11 keeps waiting for 1..10.
    ([11], [(GAP, 0, 0)]),
    ([3, 14], [(GAP, 0, 2), (IN_ORDER, 3, 3)]),
    ([3, 15], [(GAP, 0, 2), (IN_ORDER, 3, 3), (GAP, 4, 4)]),
    # a record 10 ids ahead is within the window
    ([10], []),
])
def test_reorder_emits_in_sequence_order_with_gaps_for_the_window(arrivals, expected):
    _, out = feed(arrivals)
    assert answers(out) == expected


def test_gap_is_carried_by_the_record_that_follows_it_or_by_the_one_that_forced_it():
    _, out = feed([3, 15])
    assert [e.item for e in out] == ["r3", "r3", "r15"]


def test_reorder_emits_gap_when_timeout_expires():
    stream = StreamReorder(SETTINGS, 0.0)
    assert stream.offer(2, "r2", 0.0).emissions == []
    assert stream.offer(4, "r4", 50.0).emissions == []
    assert stream.next_deadline_ms() == 200.0
    assert stream.expire(199.0) == []
    # 0-1 were known missing since 2 arrived (t=0), 3 since 4 arrived (t=50): both deadlines have passed.
    assert answers(stream.expire(250.0)) == [(GAP, 0, 1), (IN_ORDER, 2, 2), (GAP, 3, 3), (IN_ORDER, 4, 4)]
    assert stream.buffered == 0 and stream.next_deadline_ms() is None


def test_timeout_counts_from_the_first_record_that_showed_the_id_missing():
    stream = StreamReorder(SETTINGS, 0.0)
    stream.offer(5, "r5", 0.0)
    stream.offer(3, "r3", 150.0)
    assert answers(stream.expire(200.0)) == [(GAP, 0, 2), (IN_ORDER, 3, 3), (GAP, 4, 4), (IN_ORDER, 5, 5)]


def test_record_given_up_as_gap_is_answered_late_once_then_dropped_as_duplicate():
    stream = StreamReorder(SETTINGS, 0.0)
    stream.offer(1, "r1", 0.0)
    stream.expire(500.0)
    late = stream.offer(0, "r0", 600.0)
    assert answers(late.emissions) == [(LATE, 0, 0)] and late.emissions[0].item == "r0"
    again = stream.offer(0, "r0", 700.0)
    assert again.emissions == [] and again.duplicate


def test_duplicate_of_an_emitted_record_is_dropped_not_late():
    stream, _ = feed([0, 1, 2])
    offer = stream.offer(1, "again", 0.0)
    assert offer.duplicate and offer.emissions == []


def test_sequence_end_flushes_waiting_records_with_their_gaps():
    stream, out = feed([1, 4])
    assert out == []
    assert answers(stream.end()) == [(GAP, 0, 0), (IN_ORDER, 1, 1), (GAP, 2, 3), (IN_ORDER, 4, 4)]
    assert stream.buffered == 0


def test_buffer_overflow_is_refused_and_leaves_the_stream_unchanged():
    stream = StreamReorder(ReorderSettings(max_gap=10, max_buffered=2), 0.0)
    stream.offer(1, "r1", 0.0)
    stream.offer(2, "r2", 0.0)
    with pytest.raises(BufferFull, match="wait for sequence_id 0"):
        stream.offer(3, "r3", 0.0)
    assert stream.buffered == 2
    assert answers(stream.offer(0, "r0", 0.0).emissions) == [(IN_ORDER, 0, 0), (IN_ORDER, 1, 1), (IN_ORDER, 2, 2)]


@pytest.mark.parametrize("parameters, message", [
    ({"max_gap": {"string_value": "-1"}}, "max_gap must be >= 0"),
    ({"max_buffered": {"string_value": "0"}}, "max_buffered must be >= 1"),
    ({"reorder_timeout_ms": {"string_value": "soon"}}, "reorder_timeout_ms: expected a number"),
    ({"max_gap": {"string_value": "2.5"}}, "max_gap: expected an integer"),
    ({"stream_idle_ms": {"string_value": "100"}}, "stream_idle_ms (100.0) must not be below"),
])
def test_settings_refuse_values_that_cannot_work(parameters, message):
    with pytest.raises(ValueError) as err:
        read_parameters(ReorderSettings, parameters)
    assert message in str(err.value)


def test_settings_default_to_the_documented_values():
    s = read_parameters(ReorderSettings, {})
    assert (s.max_gap, s.reorder_timeout_ms, s.first_sequence_id) == (10, 200.0, 0)


def test_table_evicts_idle_streams_and_counts_what_happened():
    table = StreamTable(ReorderSettings(reorder_timeout_ms=200, stream_idle_ms=1000))
    table.start("a", 0.0)
    table.offer("a", 1, "a1", 0.0)
    table.offer("a", 1, "a1", 0.0)
    table.start("b", 0.0)
    table.offer("b", 0, "b0", 900.0)
    assert table.buffered == 1
    assert answers(table.expire(300.0)) == [(GAP, 0, 0), (IN_ORDER, 1, 1)]
    table.expire(1500.0)
    assert len(table) == 1  # "a" idle since 0 ms is gone, "b" seen at 900 ms stays
    assert (table.counts.duplicate, table.counts.reordered, table.counts.gap, table.counts.evicted) == (1, 1, 1, 1)


def test_a_stream_seen_without_its_start_goes_on_from_its_first_record():
    table = StreamTable(SETTINGS)
    assert answers(table.offer("x", 500, "x500", 0.0).emissions) == [(IN_ORDER, 500, 500)]


def test_restarting_a_stream_answers_what_the_old_sequence_held():
    table = StreamTable(SETTINGS)
    table.start("a", 0.0)
    table.offer("a", 2, "a2", 0.0)
    assert answers(table.start("a", 10.0)) == [(GAP, 0, 1), (IN_ORDER, 2, 2)]
    assert answers(table.offer("a", 0, "new0", 10.0).emissions) == [(IN_ORDER, 0, 0)]


def test_given_up_ranges_remembered_per_stream_are_bounded():
    stream = StreamReorder(ReorderSettings(max_gap=0), 0.0)
    for i in range(0, 4 * MAX_SKIPPED_RANGES, 2):
        stream.offer(i + 1, i + 1, 0.0)
    assert len(stream._skipped) == MAX_SKIPPED_RANGES


CLOCK_STEPS_MS = (0.0, 0.0, 1.0, 30.0, 250.0)


@st.composite
def deliveries(draw):
    """A stream of n records put through loss, duplication, bounded shuffling and clock steps. One draw per record
    and choice (drawing is most of this test's time): a record is lost at 1 in 20, sent 2 or 3 times at 1 in 15
    each; each draw shrinks towards a record kept, sent once, with no clock step."""
    n = draw(st.integers(1, 60))
    window = draw(st.integers(0, 15))
    kept = [i for i in range(n) if draw(st.integers(0, 19)) < 19]
    extra = [draw(st.integers(0, 14)) for _ in kept]
    copies = [i for i, e in zip(kept, extra) for _ in range(1 + (e if e < 3 else 0))]
    keys = [pos + draw(st.floats(0, window)) for pos in range(len(copies))]
    order = [i for _, i in sorted(zip(keys, copies), key=lambda kv: kv[0])]
    steps = [CLOCK_STEPS_MS[draw(st.integers(0, len(CLOCK_STEPS_MS) - 1))] for _ in order]
    return order, steps


# Seeded bugs (a record not drained, a window or buffer bound off by one, a GAP without its carrier) were found
# within 4 to 172 examples, most within 60.
@settings(max_examples=300, deadline=None)
@given(deliveries(), st.integers(0, 12), st.integers(1, 16))
def test_any_permutation_duplication_and_loss_gives_in_order_exactly_once_output(delivery, max_gap, max_buffered):
    order, steps = delivery
    table = StreamTable(ReorderSettings(max_gap=max_gap, reorder_timeout_ms=200, max_buffered=max_buffered))
    table.start("s", 0.0)
    emitted, accepted, now = [], set(), 0.0
    for sequence_id, step in zip(order, steps):
        now += step
        emitted += table.expire(now)
        try:
            offer = table.offer("s", sequence_id, sequence_id, now)
        except BufferFull:
            continue
        if not offer.duplicate:
            accepted.add(sequence_id)
        emitted += offer.emissions
        assert table.buffered <= min(max_buffered, max_gap)
    emitted += table.end("s")

    in_order = [e.sequence_id for e in emitted if e.status == IN_ORDER]
    late = [e.sequence_id for e in emitted if e.status == LATE]
    gaps = [(e.sequence_id, e.last_id) for e in emitted if e.status == GAP]
    assert in_order == sorted(set(in_order)), "in-order answers must be strictly increasing"
    assert sorted(in_order + late) == sorted(accepted), "every accepted id is answered exactly once"
    given_up = [i for first, last in gaps for i in range(first, last + 1)]
    assert not set(given_up) & set(in_order)
    assert set(late) <= set(given_up)
    covered = sorted(in_order + given_up)
    assert covered == list(range(len(covered))), "answers and gaps cover the ids from the first, once each"
    for position, e in enumerate(emitted):
        if e.status == GAP:
            later = [f for f in emitted[position + 1:] if f.status == IN_ORDER and f.item == e.item]
            assert later, f"GAP {e.sequence_id}-{e.last_id} is carried by a record answered after it"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 80), st.integers(0, 10), st.randoms(use_true_random=False))
def test_shuffle_within_the_window_without_loss_or_waiting_gives_no_gap(n, window, rng):
    order = sorted(range(n), key=lambda i: i + rng.uniform(0, window))
    _, out = feed(order, ReorderSettings(max_gap=10, max_buffered=64))
    assert answers(out) == [(IN_ORDER, i, i) for i in range(n)]


def test_a_new_stream_beyond_max_streams_evicts_the_longest_quiet_one_answering_what_it_held():
    table = StreamTable(ReorderSettings(max_streams=3))
    table.start("a", 0.0)
    table.offer("a", 2, "a2", 0.0)  # waits for 0 and 1
    table.start("b", 1.0)
    table.start("c", 2.0)
    table.offer("a", 3, "a3", 5.0)  # "a" heard from last: "b" is now the quietest
    assert answers(table.start("d", 6.0)) == []
    assert len(table) == 3 and table.first_id("b") is None
    # "c" is next: evicting it costs nothing waiting; then "a", whose records are answered with the GAP before them.
    assert answers(table.offer("e", 7, "e7", 7.0).emissions) == [(IN_ORDER, 7, 7)]
    assert answers(table.start("f", 8.0)) == [(GAP, 0, 1), (IN_ORDER, 2, 2), (IN_ORDER, 3, 3)]
    assert len(table) == 3 and table.buffered == 0 and table.counts.evicted == 3


@pytest.mark.parametrize("streams", [1, 7, 50])
def test_the_table_never_holds_more_than_max_streams_however_many_streams_arrive(streams):
    table = StreamTable(ReorderSettings(max_streams=streams))
    for i in range(500):
        (table.start if i % 2 else lambda s, now: table.offer(s, 1, s, now))(f"s{i}", float(i))
        assert len(table) <= streams
    assert table.counts.evicted == 500 - streams


def test_settings_refuse_a_table_without_room():
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        read_parameters(ReorderSettings, {"max_streams": {"string_value": "0"}})
