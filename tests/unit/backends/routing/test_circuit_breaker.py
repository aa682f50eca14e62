import pytest

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.routing.circuit_breaker import CLOSED, HALF_OPEN, OPEN, BreakerSettings, CircuitBreaker
from tests.unit.fake_clock import Clock

SETTINGS = BreakerSettings(window_seconds=5, max_error_rate=0.1, max_p99_seconds=0.25, min_requests=20,
                           open_seconds=2)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def breaker(clock):
    return CircuitBreaker(SETTINGS, clock)


def feed(breaker, clock, outcomes, step=0.01):
    for ok, latency in outcomes:
        clock.now += step
        breaker.record(ok, latency)


def test_error_rate_over_ten_percent_opens_the_breaker(breaker, clock):
    feed(breaker, clock, [(True, 0.01)] * 17 + [(False, 0.01)] * 3)
    assert breaker.state == OPEN and not breaker.allow()


def test_error_rate_at_ten_percent_keeps_it_closed(breaker, clock):
    feed(breaker, clock, [(True, 0.01)] * 18 + [(False, 0.01)] * 2)
    assert breaker.state == CLOSED and breaker.allow()


def test_too_few_requests_never_open_it(breaker, clock):
    feed(breaker, clock, [(False, 0.01)] * 19)
    assert breaker.state == CLOSED


def test_slow_p99_opens_it_even_without_errors(breaker, clock):
    feed(breaker, clock, [(True, 0.01)] * 90 + [(True, 0.4)] * 10, step=0.2)
    assert breaker.state == OPEN


def test_old_outcomes_leave_the_window(breaker, clock):
    feed(breaker, clock, [(False, 0.01)] * 10)
    clock.now += 6
    feed(breaker, clock, [(True, 0.01)] * 19)
    assert breaker.state == CLOSED


def test_after_the_open_time_one_probe_goes_through_and_success_closes(breaker, clock):
    feed(breaker, clock, [(False, 0.01)] * 20)
    assert breaker.state == OPEN
    clock.now += 2
    assert breaker.allow() and breaker.state == HALF_OPEN
    assert not breaker.allow(), "only one probe at a time"
    breaker.record(True, 0.01)
    assert breaker.state == CLOSED and breaker.allow()


def test_failed_probe_opens_it_again_for_another_open_time(breaker, clock):
    feed(breaker, clock, [(False, 0.01)] * 20)
    clock.now += 2
    assert breaker.allow()
    breaker.record(False, 0.01)
    assert breaker.state == OPEN and not breaker.allow()
    clock.now += 1.9
    assert not breaker.allow()
    clock.now += 0.2
    assert breaker.allow()


def test_rows_weigh_the_error_rate(breaker, clock):
    clock.now += 0.2
    breaker.record(True, 0.01, rows=100)
    clock.now += 0.2
    breaker.record(False, 0.01, rows=5)
    assert breaker.state == CLOSED
    clock.now += 0.2
    breaker.record(False, 0.01, rows=10)
    assert breaker.state == OPEN


@pytest.mark.parametrize("params, message", [
    ({"breaker_max_error_rate": {"string_value": "1.5"}}, "error rate"),
    ({"breaker_window_seconds": {"string_value": "0"}}, "positive"),
    ({"breaker_max_p99_ms": {"string_value": "fast"}}, "expected a number"),
])
def test_bad_breaker_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        read_parameters(BreakerSettings, params)


def test_breaker_parameters_are_read_in_their_units():
    settings = read_parameters(BreakerSettings, {"breaker_max_p99_ms": {"string_value": "150"},
                                                "breaker_min_requests": {"string_value": "5"}})
    assert settings.max_p99_seconds == 0.15 and settings.min_requests == 5 and settings.window_seconds == 5
