import pytest

from s2t.backends.llm.stream_timing import StreamTiming, TokenRate, TtftEstimate


def test_stream_timing_gives_ttft_once_then_gaps():
    timing = StreamTiming(started=10.0)
    assert timing.token(10.5) == (0.5, None)
    assert timing.token(10.52) == (None, pytest.approx(0.02))
    assert timing.token(10.56) == (None, pytest.approx(0.04))
    assert timing.tokens == 3


def test_token_rate_counts_only_the_window():
    rate = TokenRate(window_s=10.0)
    for t in range(20):
        rate.add(float(t), tokens=5)
    assert rate.rate(19.5) == pytest.approx(5 * 10 / 10.0)
    assert rate.rate(100.0) == 0.0


def test_ttft_estimate_starts_unknown_and_follows_recent_values():
    estimate = TtftEstimate(weight=0.5)
    assert estimate.value is None
    estimate.observe(2.0)
    estimate.observe(0.0)
    assert estimate.value == pytest.approx(1.0)
