import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.runtime.model_parameters import ParameterError, read_parameters
from s2t.backends.llm.batching import (FIFO, MIN_MEASURED_PROMPT_TOKENS, SHORTEST_FIRST, STARVATION_DELAYS,
                                      BatchingSettings, GroupTimings, LengthAwareQueue, PromptEvaluationRate)
from tests.unit.fake_clock import Clock

AWARE = BatchingSettings()


def queue_of(lengths, policy_settings=AWARE, arrived_ms=0.0):
    queue = LengthAwareQueue(policy_settings)
    for i, n in enumerate(lengths):
        queue.add(f"r{i}", n, arrived_ms + i)
    return queue


def keys(taken):
    return [q.key for q in taken]


@pytest.mark.parametrize("lengths, expected", [
    ([10, 30, 31], [[10, 30], [31]]),
    ([10, 11, 500, 12, 900], [[10, 11, 12], [500, 900]]),
    ([400, 5], [[5], [400]]),
    ([7], [[7]]),
    ([], []),
])
def test_groups_never_mix_prompts_more_than_three_times_apart(lengths, expected):
    assert [[q.prompt_tokens for q in g] for g in queue_of(lengths).groups()] == expected


@given(st.lists(st.integers(1, 5000), max_size=200), st.floats(1.0, 10.0), st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_every_group_respects_the_ratio_and_the_size_bound(lengths, ratio, size):
    queue = queue_of(lengths, BatchingSettings(max_length_ratio=ratio, max_group_size=size))
    groups = queue.groups()
    assert sum(len(g) for g in groups) == len(lengths)
    for group in groups:
        tokens = [q.prompt_tokens for q in group]
        assert len(group) <= size
        assert max(tokens) <= min(tokens) * ratio


HOLD_MS_PER_TOKEN = AWARE.hold_per_prompt_token_ms


@pytest.mark.parametrize("tokens, hold_ms", [
    # A short prompt on an idle engine goes at once (well under the old fixed 200 ms); a long one waits a fraction of
    # its own evaluation for shorter company; no request ever waits more than the delay.
    (1, 1 * HOLD_MS_PER_TOKEN),
    (30, 30 * HOLD_MS_PER_TOKEN),
    (480, 480 * HOLD_MS_PER_TOKEN),
    (100_000, 200.0),
])
def test_a_lone_request_on_an_idle_engine_waits_only_its_hold(tokens, hold_ms):
    clock = Clock(0.0)
    queue = LengthAwareQueue(AWARE)
    queue.add("lone", tokens, clock() * 1000)
    assert queue.next_deadline_ms() == pytest.approx(hold_ms)
    clock.now = (hold_ms - 0.01) / 1000
    assert queue.take(free_slots=8, prefilling=0, now_ms=clock() * 1000) == []
    clock.now = hold_ms / 1000
    assert keys(queue.take(free_slots=8, prefilling=0, now_ms=clock() * 1000)) == ["lone"]


def test_a_short_prompt_arriving_during_a_long_ones_hold_goes_first():
    # The burst length-aware admission is built for: long prompts sent just before short ones, on an idle engine.
    clock = Clock(0.0)
    queue = LengthAwareQueue(AWARE)
    queue.add("long-1", 480, clock() * 1000)
    queue.add("long-2", 480, clock() * 1000)
    clock.now = 0.020
    for n in range(6):
        queue.add(f"short-{n}", 37, clock() * 1000)
    clock.now = 0.020 + 37 * HOLD_MS_PER_TOKEN / 1000
    assert keys(queue.take(free_slots=8, prefilling=0, now_ms=clock() * 1000)) == [f"short-{n}" for n in range(6)]
    # The long prompts wait for the short ones' evaluation, then go together.
    clock.now = 0.5
    assert queue.take(free_slots=2, prefilling=6, now_ms=clock() * 1000) == []
    assert keys(queue.take(free_slots=2, prefilling=0, now_ms=clock() * 1000)) == ["long-1", "long-2"]


def test_when_a_long_prompts_hold_ends_a_shorter_one_waiting_goes_before_it():
    queue = LengthAwareQueue(AWARE)
    queue.add("long", 800, 0.0)
    queue.add("short", 10, 119.0)
    assert keys(queue.take(free_slots=8, prefilling=0, now_ms=800 * HOLD_MS_PER_TOKEN)) == ["short"]


@pytest.mark.parametrize("hold_per_token, lengths, admitted_at_ms", [
    # The old fixed delay is one setting away: a hold per token large enough that every hold is the delay.
    (1000.0, [10, 11], 200.0),
    (0.0, [10, 11], 0.0),
    (0.5, [10, 11], 5.0),
])
def test_the_hold_per_token_sets_when_an_idle_engine_admits(hold_per_token, lengths, admitted_at_ms):
    queue = queue_of(lengths, BatchingSettings(hold_per_prompt_token_ms=hold_per_token), arrived_ms=0.0)
    if admitted_at_ms > 0:
        assert queue.take(free_slots=8, prefilling=0, now_ms=admitted_at_ms - 0.01) == []
    assert len(queue.take(free_slots=8, prefilling=0, now_ms=admitted_at_ms)) == 2


@given(st.lists(st.tuples(st.integers(1, 2000), st.floats(0, 1000)), min_size=1, max_size=40),
       st.floats(0, 2.0), st.floats(0, 500), st.integers(0, 3))
@settings(max_examples=300, deadline=None)
def test_admission_is_work_conserving_and_orders_only_the_requests_waiting(arrivals, hold_per_token, delay,
                                                                          prefilling):
    """Nothing is admitted while a prompt is evaluated; otherwise, once the earliest hold has ended, a request is
    admitted at once, and it belongs to the shortest group waiting (or to a starving one); no request ever waits
    past its deadline for company while the engine is free."""
    settings_ = BatchingSettings(hold_per_prompt_token_ms=hold_per_token, max_queue_delay_ms=delay)
    queue = LengthAwareQueue(settings_)
    for i, (tokens, at) in enumerate(sorted(arrivals, key=lambda a: a[1])):
        queue.add(f"r{i}", tokens, at)
    last = max(at for _, at in arrivals)
    deadline = queue.next_deadline_ms()
    assert deadline == pytest.approx(min(at + min(tokens * hold_per_token, delay) for tokens, at in arrivals))
    now = max(last, deadline)
    holders = queue.slot_holders(8, now)
    taken = queue.take(free_slots=8, prefilling=prefilling, now_ms=now)
    if prefilling:
        assert taken == []
        return
    assert taken
    assert {q.key for q in taken} <= {q.key for q in holders}
    starving = any(now - q.arrived_ms >= delay * STARVATION_DELAYS for q in taken)
    # The shortest group of the requests the slots are kept for: within the length ratio of the shortest of them.
    assert starving or max(q.prompt_tokens for q in taken) <= min(q.prompt_tokens for q in holders) * 3.0


def test_nothing_is_admitted_while_a_prompt_is_evaluated_even_past_every_hold():
    queue = queue_of([10, 11])
    assert queue.take(free_slots=8, prefilling=1, now_ms=150) == []
    assert len(queue.take(free_slots=8, prefilling=0, now_ms=150)) == 2


def test_once_a_group_is_due_the_shortest_prompts_go_first_even_if_they_came_later():
    queue = LengthAwareQueue(AWARE)
    queue.add("long-1", 800, 0.0)
    queue.add("long-2", 900, 1.0)
    queue.add("short-1", 12, 20.0)
    queue.add("short-2", 10, 21.0)
    assert keys(queue.take(free_slots=8, prefilling=0, now_ms=200)) == ["short-1", "short-2"]
    assert len(queue) == 2


def test_no_group_is_admitted_while_another_groups_prompts_are_evaluated():
    queue = queue_of([10, 800])
    assert queue.take(free_slots=8, prefilling=1, now_ms=1000) == []


def test_a_full_group_goes_without_waiting():
    queue = queue_of([10] * 4, BatchingSettings(max_group_size=4))
    assert len(queue.take(free_slots=8, prefilling=0, now_ms=5)) == 4


def test_a_long_group_waiting_ten_delays_goes_before_fresh_short_ones():
    queue = LengthAwareQueue(AWARE)
    queue.add("long", 900, 0.0)
    queue.add("short", 10, 1990.0)
    assert keys(queue.take(free_slots=8, prefilling=0, now_ms=2000)) == ["long"]


def test_admission_never_exceeds_the_free_slots_and_takes_the_oldest_of_the_group():
    queue = queue_of([10, 11, 12, 13])
    assert keys(queue.take(free_slots=2, prefilling=0, now_ms=500)) == ["r0", "r1"]
    assert queue.take(free_slots=0, prefilling=0, now_ms=500) == []


def test_fifo_admits_the_oldest_at_once_whatever_their_lengths():
    queue = queue_of([800, 12, 900], BatchingSettings(policy=FIFO))
    assert keys(queue.take(free_slots=2, prefilling=1, now_ms=0)) == ["r0", "r1"]


def test_drain_returns_everyone_oldest_first():
    queue = queue_of([800, 12, 900])
    assert keys(queue.drain()) == ["r0", "r1", "r2"] and len(queue) == 0


@pytest.mark.parametrize("parameters, message", [
    ({"batching_policy": {"string_value": "random"}}, "batching_policy"),
    ({"max_length_ratio": {"string_value": "0.5"}}, "max_length_ratio"),
    ({"max_group_size": {"string_value": "0"}}, "max_group_size"),
    ({"max_queue_delay_ms": {"string_value": "soon"}}, "max_queue_delay_ms: expected a number"),
    ({"max_queue_size": {"string_value": "0"}}, "max_queue_size must be at least 1"),
    ({"hold_per_prompt_token_ms": {"string_value": "-1"}}, "hold_per_prompt_token_ms must be >= 0"),
    ({"max_prefill_tokens": {"string_value": "0"}}, "max_prefill_tokens must be at least 1"),
    ({"hold_fraction": {"string_value": "1.5"}}, "hold_fraction must be between 0 and 1"),
    ({"hold_fraction": {"string_value": "-0.1"}}, "hold_fraction must be between 0 and 1"),
    ({"slot_choice": {"string_value": "random"}}, "slot_choice must be one of longest_first, shortest_first"),
])
def test_bad_batching_parameters_refuse_to_load(parameters, message):
    with pytest.raises(ParameterError, match=message):
        read_parameters(BatchingSettings, parameters)


def test_batching_parameters_default_to_the_design():
    assert read_parameters(BatchingSettings, {}) == BatchingSettings("length_aware", 3.0, 32, 200.0, 0.15, 64, 1024, 0.1,
                                                                     "longest_first")


def test_the_queue_is_full_at_its_configured_size():
    queue = queue_of([10, 11], BatchingSettings(max_queue_size=3))
    assert not queue.full
    queue.add("r2", 12, 2.0)
    assert queue.full


def test_requests_whose_client_left_are_taken_out_and_the_others_keep_their_place():
    queue = queue_of([10, 800, 11, 900])
    assert keys(queue.remove(lambda key: key in ("r1", "r2"))) == ["r1", "r2"]
    assert keys(queue.drain()) == ["r0", "r3"]
    assert queue.remove(lambda key: True) == []


@pytest.mark.parametrize("lengths, budget, admitted", [
    ([600, 700, 650], 1024, ["r0"]),
    ([600, 700, 650], 1300, ["r0", "r1"]),
    ([2000], 1024, ["r0"]),
    ([100] * 12, 1024, [f"r{i}" for i in range(8)]),
    ([100] * 12, 350, ["r0", "r1", "r2"]),
])
def test_admitted_prompts_stay_within_the_prefill_budget_and_one_always_goes(lengths, budget, admitted):
    for policy in ("length_aware", FIFO):
        queue = queue_of(lengths, BatchingSettings(policy=policy, max_prefill_tokens=budget))
        assert keys(queue.take(free_slots=8, prefilling=0, now_ms=10_000)) == admitted


@given(st.lists(st.integers(1, 1024), min_size=1, max_size=40), st.integers(1, 4096))
@settings(max_examples=200, deadline=None)
def test_admission_never_takes_more_prompt_tokens_than_the_budget_unless_one_prompt_alone(lengths, budget):
    queue = queue_of(lengths, BatchingSettings(max_prefill_tokens=budget))
    taken = queue.take(free_slots=8, prefilling=0, now_ms=100_000)
    assert taken and (len(taken) == 1 or sum(q.prompt_tokens for q in taken) <= budget)


def measured(ms_per_token, settings_=AWARE, tokens=400):
    """A queue whose engine has evaluated one group of `tokens` prompt tokens at `ms_per_token`."""
    queue = LengthAwareQueue(settings_)
    group = GroupTimings(1)
    assert group.report(tokens, tokens * ms_per_token)
    queue.observe(group)
    return queue


@pytest.mark.parametrize("ms_per_token, tokens, hold_ms", [
    # Unloaded (1.5 ms per token): the prior's hold. Ten times slower under load: ten times the hold, so the short
    # prompts sent just after a long one still arrive within it; always capped by max_queue_delay_ms.
    (1.5, 30, 30 * 0.15),
    (1.5, 480, 480 * 0.15),
    (15.0, 30, 30 * 1.5),
    (15.0, 120, 120 * 1.5),
    (15.0, 480, 200.0),
    (0.5, 480, 480 * 0.05),
])
def test_the_hold_follows_the_measured_evaluation_rate_within_the_cap(ms_per_token, tokens, hold_ms):
    queue = measured(ms_per_token)
    queue.add("r", tokens, 0.0)
    assert queue.next_deadline_ms() == pytest.approx(hold_ms)


def test_under_a_slow_evaluation_short_prompts_sent_after_a_long_one_still_go_first():
    # At 15 ms per token, the short prompts come 60 ms after the long one: past the fixed 0.15 ms/token hold (72 ms
    # for 480 tokens, with a slow client), well within the measured one.
    for queue, short_first in ((LengthAwareQueue(AWARE), False), (measured(15.0), True)):
        queue.add("long", 480, 0.0)
        first = queue.take(free_slots=8, prefilling=0, now_ms=75.0)
        if short_first:
            assert first == []
            queue.add("short", 30, 60.0)
            assert keys(queue.take(free_slots=8, prefilling=0, now_ms=60.0 + 45.0)) == ["short"]
        else:
            assert keys(first) == ["long"]


@pytest.mark.parametrize("samples, expected", [
    ([], None),
    ([(400, 600.0)], 1.5),
    ([(400, 600.0), (400, 6000.0)], 0.7 * 1.5 + 0.3 * 15.0),
    # Too short to measure, no time, or not an evaluation (a cached prompt, a clock step): ignored.
    ([(MIN_MEASURED_PROMPT_TOKENS - 1, 500.0)], None),
    ([(400, 0.0)], None),
    ([(400, 600.0), (400, 1e9)], 1.5),
    ([(400, 600.0), (0, 10.0)], 1.5),
])
def test_the_evaluation_rate_is_a_moving_estimate_of_valid_samples(samples, expected):
    rate = PromptEvaluationRate()
    for tokens, ms in samples:
        rate.observe(tokens, ms)
    assert rate.ms_per_token == (None if expected is None else pytest.approx(expected))


def test_a_groups_rate_is_its_longest_evaluation_over_all_its_tokens_once_every_member_reported():
    # Prompts evaluated in one batch each report the whole batch's time.
    group = GroupTimings(3)
    assert not group.report(100, 450.0)
    assert not group.report(None, None)  # cancelled before its prompt was evaluated
    assert group.report(200, 455.0)
    assert (group.tokens, group.ms) == (300, 455.0)


@given(st.lists(st.tuples(st.integers(0, 5000), st.floats(0, 1e7)), max_size=30), st.integers(1, 5000),
       st.floats(0, 1000), st.floats(0, 1))
@settings(max_examples=300, deadline=None)
def test_a_hold_is_never_negative_nor_past_the_cap_whatever_was_measured(samples, tokens, delay, fraction):
    queue = LengthAwareQueue(BatchingSettings(max_queue_delay_ms=delay, hold_fraction=fraction))
    for n, ms in samples:
        group = GroupTimings(1)
        group.report(n, ms)
        queue.observe(group)
    queue.add("r", tokens, 10.0)
    assert 10.0 <= queue.next_deadline_ms() <= 10.0 + delay
    # Work-conserving: once its hold has ended, an idle engine takes it.
    assert keys(queue.take(free_slots=1, prefilling=0, now_ms=queue.next_deadline_ms())) == ["r"]


# The bench's burst: four loan files sent first, then twelve short questions and paragraphs (their token counts).
BURST_LONG = [200] * 4
BURST_OTHERS = [20, 65, 20, 22, 28] * 2 + [20, 65]


def burst_queue(settings_=AWARE):
    queue = LengthAwareQueue(settings_)
    for i, n in enumerate(BURST_LONG):
        queue.add(f"long-{i}", n, 0.0)
    for i, n in enumerate(BURST_OTHERS):
        queue.add(f"other-{i}", n, 20.0 + i)
    return queue


def test_in_a_burst_beyond_the_slots_the_long_prompts_get_slots_and_the_shortest_wait_evaluated_after():
    """16 requests, 8 slots: 8 must wait for a generation to end, then pay their own evaluation; those left waiting
    are the cheapest to evaluate, while the prompts admitted are still evaluated shortest group first."""
    queue = burst_queue()
    rounds, now = [], 100.0
    while sum(len(r) for r in rounds) < 8:
        admitted = sum(len(r) for r in rounds)
        taken = queue.take(free_slots=8 - admitted, prefilling=0, now_ms=now)
        assert taken, f"nothing admitted with {8 - admitted} slots free"
        # One group's prompts are evaluated at a time: nothing more goes while they are.
        assert queue.take(free_slots=8 - admitted - len(taken), prefilling=len(taken), now_ms=now) == []
        rounds.append(taken)
        now += 300.0
    # The long prompts are among those given the slots, evaluated last (shortest group first) ...
    assert sorted(keys(rounds[-1])) == [f"long-{i}" for i in range(4)]
    tokens = [[q.prompt_tokens for q in r] for r in rounds]
    assert all(max(a) < min(b) for a, b in zip(tokens, tokens[1:])), tokens
    # ... and the eight left waiting for a generation to end are the cheapest to evaluate: the short questions (the
    # oldest of their length class got the one slot left for it).
    left = queue.drain()
    assert len(left) == 8 and max(q.prompt_tokens for q in left) <= 28
    assert sorted(keys(rounds[0])) == ["other-0"] and sorted(keys(rounds[1])) == ["other-1", "other-11", "other-6"]
    assert queue.take(free_slots=0, prefilling=0, now_ms=now) == []


def test_in_a_burst_the_requests_left_waiting_are_the_cheapest_whatever_their_order():
    for order in (1, -1):
        queue = LengthAwareQueue(AWARE)
        lengths = (BURST_LONG + BURST_OTHERS)[::order]
        for i, n in enumerate(lengths):
            queue.add(f"r{i}", n, float(i))
        holders = queue.slot_holders(8, now_ms=20.0)
        held = sorted(q.prompt_tokens for q in holders)
        assert held[1:] == [65] * 3 + [200] * 4 and held[0] <= 28
        # Within the short questions' length class, the oldest gets the slot.
        assert min(holders, key=lambda q: q.prompt_tokens).arrived_ms == min(
            i for i, n in enumerate(lengths) if n <= 28)


@given(st.lists(st.tuples(st.integers(1, 3000), st.floats(0, 100)), min_size=1, max_size=40), st.integers(0, 12),
       st.floats(1.0, 6.0))
@settings(max_examples=300, deadline=None)
def test_no_request_left_waiting_is_longer_than_the_class_of_those_given_the_slots(arrivals, free_slots, ratio):
    queue = LengthAwareQueue(BatchingSettings(max_length_ratio=ratio))
    for i, (tokens, at) in enumerate(arrivals):
        queue.add(f"r{i}", tokens, at)
    holders = queue.slot_holders(free_slots, now_ms=100.0)
    held = {q.key for q in holders}
    left = [q for q in queue.drain() if q.key not in held]
    assert len(holders) == min(free_slots, len(arrivals))
    for waiting in left:
        assert all(waiting.prompt_tokens <= q.prompt_tokens * ratio for q in holders)


def test_with_slots_for_all_every_request_goes_shortest_group_first():
    queue = burst_queue()
    assert len(queue.slot_holders(16, now_ms=21.0)) == 16
    first = queue.take(free_slots=16, prefilling=0, now_ms=1000.0)
    assert all(q.prompt_tokens <= 65 for q in first)


def test_a_short_request_that_waited_ten_delays_gets_the_next_slot_before_longer_ones():
    queue = LengthAwareQueue(AWARE)
    queue.add("short", 20, 0.0)
    for i in range(3):
        queue.add(f"long-{i}", 600, 1500.0 + i)
    now = AWARE.max_queue_delay_ms * STARVATION_DELAYS
    assert keys(queue.take(free_slots=1, prefilling=0, now_ms=now - 1)) == ["long-0"]
    assert keys(queue.take(free_slots=1, prefilling=0, now_ms=now)) == ["short"]


def test_under_a_stream_of_long_prompts_a_short_one_waits_at_most_the_starvation_bound():
    """One slot frees every 100 ms and a longer prompt arrives with it: the short request still gets a slot once it
    has waited ten delays."""
    queue = LengthAwareQueue(AWARE)
    queue.add("short", 20, 0.0)
    bound = AWARE.max_queue_delay_ms * STARVATION_DELAYS
    admitted_at = None
    for step in range(1, 60):
        now = step * 100.0
        queue.add(f"long-{step}", 500, now)
        queue.add(f"long-{step}b", 500, now)
        if "short" in keys(queue.take(free_slots=1, prefilling=0, now_ms=now)):
            admitted_at = now
            break
    assert admitted_at is not None and admitted_at <= bound


def test_shortest_first_slot_choice_gives_the_burst_s_slots_to_the_short_prompts():
    queue = burst_queue(BatchingSettings(slot_choice=SHORTEST_FIRST))
    holders = queue.slot_holders(8, now_ms=21.0)
    assert len(holders) == 8 and all(q.prompt_tokens <= 28 for q in holders)
    assert all(q.prompt_tokens <= 28 for q in queue.take(free_slots=8, prefilling=0, now_ms=21.0))


@pytest.mark.parametrize("evaluating, lengths, admitted", [
    # A short prompt given a slot while another short one is evaluated joins it: the same steps of llama.cpp.
    ((20,), [22], ["r0"]),
    ((60,), [20, 25], ["r0", "r1"]),
    # Not beside a prompt of a shorter class: it would wait out the longer one's evaluation.
    ((20,), [200], []),
    # Not past max_prefill_tokens with the prompts being evaluated.
    ((500, 500), [400], []),
    ((300, 300), [250, 250], ["r0"]),
])
def test_a_group_no_longer_than_the_prompts_being_evaluated_joins_them_within_the_budget(evaluating, lengths, admitted):
    queue = queue_of(lengths)
    taken = queue.take(free_slots=4, prefilling=len(evaluating), now_ms=1000.0, evaluating=evaluating)
    assert keys(taken) == admitted


def test_without_the_lengths_being_evaluated_nothing_joins_them():
    assert queue_of([10]).take(free_slots=4, prefilling=1, now_ms=1000.0) == []


def test_a_starving_long_group_stops_short_prompts_joining_so_it_goes_next():
    queue = LengthAwareQueue(AWARE)
    queue.add("long", 600, 0.0)
    queue.add("short", 20, 1990.0)
    now = AWARE.max_queue_delay_ms * STARVATION_DELAYS
    assert queue.take(free_slots=4, prefilling=1, now_ms=now, evaluating=(20,)) == []
    assert keys(queue.take(free_slots=4, prefilling=0, now_ms=now)) == ["long"]


@given(st.lists(st.integers(1, 2000), min_size=1, max_size=30), st.lists(st.integers(1, 1000), min_size=1, max_size=8))
@settings(max_examples=300, deadline=None)
def test_what_joins_an_evaluation_is_never_longer_than_its_class_nor_past_the_budget(lengths, evaluating):
    queue = queue_of(lengths)
    taken = queue.take(free_slots=8, prefilling=len(evaluating), now_ms=100_000.0, evaluating=tuple(evaluating))
    if taken:
        assert max(q.prompt_tokens for q in taken) <= min(evaluating) * AWARE.max_length_ratio
        assert sum(evaluating) + sum(q.prompt_tokens for q in taken) <= AWARE.max_prefill_tokens
