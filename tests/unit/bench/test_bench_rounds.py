"""Rounds taken in turns (s2t/bench/harness/rounds.py): each round compared within itself, the median and worst
rounds."""
import math

import pytest
from hypothesis import given, strategies as st

from s2t.bench.harness import rounds

NAN = float("nan")


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


@pytest.mark.parametrize("values, higher_is_better, median, worst, median_at, worst_at, missing", [
    ([2.0], True, 2.0, 2.0, 0, 0, 0),  # one round: it is both
    ([1.8, 2.4, 2.1], True, 2.1, 1.8, 2, 0, 0),  # odd: the middle one
    ([1.8, 2.4, 2.1, 2.2], True, 2.1, 1.8, 2, 0, 0),  # even: the worse of the two middle ones
    ([0.3, 0.5, 0.4, 0.2], False, 0.4, 0.5, 2, 1, 0),  # lower is better: the worse middle one is the higher
    ([1.2, 1.5], False, 1.5, 1.5, 1, 1, 0),  # two starts: the median start is the slower
    ([2.0, NAN, 1.0], True, 1.0, 1.0, 2, 2, 1),  # a round without the figure is left out and counted
    ([None, 3.0], True, 3.0, 3.0, 1, 1, 1),
    ([NAN, NAN], True, NAN, NAN, None, None, 2),
    ([], True, NAN, NAN, None, None, 0),
    ([2.0, 2.0, 2.0], True, 2.0, 2.0, 1, 0, 0),  # ties: the earlier round is the worse
])
def test_the_median_round_is_a_round_and_the_worst_is_the_lowest_or_highest(values, higher_is_better, median, worst,
                                                                              median_at, worst_at, missing):
    found = rounds.spread(values, higher_is_better)
    assert _same(found.median, median) and _same(found.worst, worst)
    assert (found.median_at, found.worst_at, found.missing) == (median_at, worst_at, missing)
    assert len(found.values) == len(values)


@given(st.lists(st.floats(min_value=0.01, max_value=1e6), min_size=1, max_size=12), st.booleans())
def test_the_worst_round_is_never_better_than_the_median_round(values, higher_is_better):
    found = rounds.spread(values, higher_is_better)
    assert found.median in values and found.worst in values
    assert (found.worst <= found.median) if higher_is_better else (found.worst >= found.median)
    assert found.values[found.median_at] == found.median and found.values[found.worst_at] == found.worst


def _side(*figures):
    """One entry per round: (req/s, p99 ms, CPU ms per request), None for a round the side has not."""
    return [None if f is None else {"throughput": f[0], "p99_ms": f[1], "cpu_ms_per_request": f[2]} for f in figures]


@pytest.mark.parametrize("triton, apps, opponents, ratios, p99_above, p99_unknown, every_round", [
    # One round.
    (_side((3000, 4.0, 0.1)), {"baseline": _side((1000, 5.0, 0.3))}, ("baseline",), (3.0,), 0, 0, True),
    # The strongest app of each round is the one compared, whichever it is.
    (_side((3000, 4.0, 0.1), (2000, 4.0, 0.1)),
     {"baseline": _side((1000, 5.0, 0.3), (500, 3.0, 0.3)), "fastapi-docs": _side((800, 9.0, 0.4), (1000, 6.0, 0.4))},
     ("baseline", "fastapi-docs"), (3.0, 2.0), 0, 0, True),
    # Triton's p99 above FastAPI's in one round of three; equal p99s are at or below.
    (_side((3000, 4.0, 0.1), (3000, 6.0, 0.1), (3000, 5.0, 0.1)),
     {"baseline": _side((1000, 5.0, 0.3), (1000, 5.0, 0.3), (1000, 5.0, 0.3))},
     ("baseline",) * 3, (3.0, 3.0, 3.0), 1, 0, False),
    # Apps tied on req/s: the first named is the one compared (its p99 is the one that counts).
    (_side((2000, 4.0, 0.1)), {"baseline": _side((1000, 3.0, 0.3)), "fastapi-docs": _side((1000, 9.0, 0.4))},
     ("baseline",), (2.0,), 1, 0, False),
    # An app without the round: the other is compared; no app measured: no ratio, no p99 to compare.
    (_side((2000, 4.0, 0.1), (2000, 4.0, 0.1)), {"baseline": _side((1000, 5.0, 0.3)),
                                                  "fastapi-docs": _side((500, 5.0, 0.3))},
     ("baseline", None), (2.0, NAN), 0, 1, False),
    # A side with a NaN rate in a round (the run lost it): that app is not the round's strongest.
    (_side((2000, 4.0, 0.1)), {"baseline": _side((NAN, 1.0, 0.3)), "fastapi-docs": _side((1000, 5.0, 0.4))},
     ("fastapi-docs",), (2.0,), 0, 0, True),
    # Triton without the round.
    (_side(None), {"baseline": _side((1000, 5.0, 0.3))}, ("baseline",), (NAN,), 0, 1, False),
    # A p99 the generator does not report (h2load) is unknown, not "at or below".
    (_side((2000, NAN, 0.1)), {"baseline": _side((1000, 5.0, 0.3))}, ("baseline",), (2.0,), 0, 1, False),
    # No round at all.
    ([], {"baseline": []}, (), (), 0, 0, False),
])
def test_each_round_compares_triton_with_the_strongest_app_of_that_round(triton, apps, opponents, ratios, p99_above,
                                                                          p99_unknown, every_round):
    found = rounds.duel(triton, apps, "throughput", cpu="cpu_ms_per_request")
    assert found.opponents == opponents and found.rounds == len(opponents)
    assert all(_same(a, b) for a, b in zip(found.rate.values, ratios, strict=True))
    assert (found.p99_above, found.p99_unknown, found.p99_at_or_below_every_round) == (p99_above, p99_unknown,
                                                                                        every_round)


@pytest.mark.parametrize("triton_rates, app_rates, median, worst", [
    ((3000, 2000, 2500), (1000, 1000, 1000), 2.5, 2.0),  # odd
    ((3000, 2000, 2500, 2200), (1000, 1000, 1000, 1000), 2.2, 2.0),  # even: the worse middle round
    ((3000,), (1500,), 2.0, 2.0),  # one round
])
def test_the_median_and_worst_round_ratios_come_from_the_rounds(triton_rates, app_rates, median, worst):
    found = rounds.duel(_side(*((r, 1.0, 0.1) for r in triton_rates)), {"baseline": _side(*((r, 2.0, 0.3)
                                                                                           for r in app_rates))},
                        "throughput", cpu="cpu_ms_per_request")
    assert (found.rate.median, found.rate.worst) == pytest.approx((median, worst))


def test_cpu_per_request_is_compared_with_the_rounds_opponent_and_the_worst_is_the_highest():
    triton = _side((3000, 4.0, 0.12), (3000, 4.0, 0.10), (3000, 4.0, 0.15))
    baseline = _side((1000, 5.0, 0.30), (1000, 5.0, 0.30), (1000, 5.0, 0.30))
    found = rounds.duel(triton, {"baseline": baseline}, "throughput", cpu="cpu_ms_per_request")
    assert (found.cpu.median, found.cpu.worst) == pytest.approx((0.4, 0.5))
    assert all(math.isnan(v) for v in rounds.duel(triton, {"baseline": baseline}, "throughput").cpu.values)


def test_grpc_against_http_reads_the_protocol_rounds():
    grpc = [{"requests_per_s": 1200.0, "p99_ms": 9.0}, {"requests_per_s": 900.0, "p99_ms": 7.0}]
    http = [{"requests_per_s": 1000.0, "p99_ms": 8.0}, {"requests_per_s": 1000.0, "p99_ms": 8.0}]
    found = rounds.duel(grpc, {"http": http}, "requests_per_s")
    assert found.rate.values == pytest.approx((1.2, 0.9)) and found.rate.median == pytest.approx(0.9)
    assert (found.p99_above, found.p99_unknown) == (1, 0)


def test_sides_take_turns_with_the_order_rotating_round_by_round():
    order = []
    taken = rounds.take_turns(["triton", "baseline", "ceiling"], 4, lambda side, n: order.append((n, side)) or n)
    assert [side for _, side in order] == ["triton", "baseline", "ceiling", "baseline", "ceiling", "triton",
                                           "ceiling", "triton", "baseline", "triton", "baseline", "ceiling"]
    assert taken == {"triton": [0, 1, 2, 3], "baseline": [0, 1, 2, 3], "ceiling": [0, 1, 2, 3]}


def test_the_one_median_takes_the_worse_middle_of_an_even_count():
    assert rounds.median([3.0, 1.0, 2.0, 4.0]) == 2.0
    assert rounds.median([3.0, 1.0, 2.0, 4.0], higher_is_better=False) == 3.0
    found = rounds.median_round([{"rps": 10.0, "p99": 1.0}, {"rps": 30.0, "p99": 9.0}, {"rps": 20.0, "p99": 5.0}], "rps")
    assert found == {"rps": 20.0, "p99": 5.0, "round": 3}
