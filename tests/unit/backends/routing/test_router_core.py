import numpy as np
import pytest

from s2t.backends.routing.circuit_breaker import OPEN, BreakerSettings, CircuitBreaker
from s2t.backends.runtime.serving_errors import INVALID, UNAVAILABLE, InternalError, NotServing
from s2t.backends.routing.router_core import VERSION_LISTING_SECONDS, Router
from s2t.backends.routing.routing_policy import RoutingSettings, Target

PRIMARY, CANDIDATE, LITE = Target("risk_scorer"), Target("risk_scorer", 2), Target("risk_scorer_lite")
OFFSET = {"risk_scorer:1": 0.0, "risk_scorer:2": 0.001, "risk_scorer:3": 0.002, "risk_scorer_lite:1": 0.5}


class FakeScorers:
    """Each version answers numeric[:, 0] + its offset; `down` versions fail as Triton does."""

    def __init__(self, versions=(2, 1), down=(), not_loaded=()):
        self.versions, self.down, self.not_loaded, self.calls = list(versions), set(down), set(not_loaded), []

    def score(self, target, categorical, numeric):
        self.calls.append((str(target), len(numeric)))
        if str(target) in self.not_loaded:
            raise NotServing(f"Request for unknown model: '{target.model}' version {target.version} is not found")
        if str(target) in self.down:
            raise InternalError("Stub process 'risk_scorer_0_0' is not healthy.")
        return numeric[:, :1] + OFFSET[str(target)]

    def folders(self, model):
        return self.versions if model == "risk_scorer" else [1]


def rows(n):
    return np.zeros((n, 13), np.int64), np.arange(n, dtype=np.float32).reshape(-1, 1) / 1000


def router(scorers, clock=None, **kw):
    settings = RoutingSettings(PRIMARY, kw.pop("candidate", None), fallback=LITE, **kw)
    breaker = CircuitBreaker(BreakerSettings(min_requests=5, open_seconds=1), clock or (lambda: 0.0))
    return Router(settings, breaker, scorers.score, scorers.folders, clock or (lambda: 0.0))


def test_whole_batch_goes_to_the_newest_version_in_one_call_and_says_so():
    scorers = FakeScorers()
    answer = router(scorers).answer(*rows(8), [f"r-{i}" for i in range(8)], [None] * 8)
    assert scorers.calls == [("risk_scorer:2", 8)]
    assert answer.served_by == ["risk_scorer:2"] * 8 and answer.errors == [None] * 8
    np.testing.assert_allclose(answer.probability.ravel(), np.arange(8) / 1000 + 0.001, atol=1e-7)


def test_a_published_version_not_loaded_yet_is_skipped_for_the_one_serving():
    scorers = FakeScorers(versions=(3, 2, 1), not_loaded={"risk_scorer:3"})
    r = router(scorers)
    assert r.answer(*rows(2), ["a", "b"], [None, None]).served_by == ["risk_scorer:2"] * 2
    r.answer(*rows(2), ["a", "b"], [None, None])
    assert scorers.calls.count(("risk_scorer:3", 2)) == 1, "a version that is not serving is remembered briefly"


def test_failing_primary_is_answered_by_the_fallback_and_opens_the_breaker():
    scorers = FakeScorers(down={"risk_scorer:2"})
    r = router(scorers)
    answer = r.answer(*rows(6), list("abcdef"), [None] * 6)
    assert answer.served_by == ["risk_scorer_lite:1"] * 6 and answer.fallback_rows == 6
    assert r.breaker.state == OPEN
    scorers.calls.clear()
    r.answer(*rows(3), list("abc"), [None] * 3)
    assert scorers.calls == [("risk_scorer_lite:1", 3)], "while open, the primary is not even tried"


def test_primary_takes_traffic_back_after_a_good_probe():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now
    clock, scorers = Clock(), FakeScorers(down={"risk_scorer:2"})
    r = router(scorers, clock)
    r.answer(*rows(6), list("abcdef"), [None] * 6)
    scorers.down.clear()
    clock.now = 1.5
    assert r.answer(*rows(2), ["a", "b"], [None] * 2).served_by == ["risk_scorer:2"] * 2
    assert r.breaker.state == "closed"


def test_canary_rows_go_to_the_candidate_and_are_named():
    scorers = FakeScorers(versions=(1,))
    keys = [f"r-{i}" for i in range(2000)]
    answer = router(scorers, candidate=CANDIDATE, canary_percent=10).answer(*rows(2000), keys, [None] * 2000)
    assert set(answer.served_by) == {"risk_scorer:1", "risk_scorer:2"}
    assert 0.08 < answer.served_by.count("risk_scorer:2") / 2000 < 0.12
    assert sorted(scorers.calls) == sorted([("risk_scorer:1", answer.served_by.count("risk_scorer:1")),
                                            ("risk_scorer:2", answer.served_by.count("risk_scorer:2"))])


def test_shadow_never_changes_answers_and_reports_differences():
    scorers = FakeScorers(versions=(1,))
    r = router(scorers, candidate=Target("risk_scorer", 3), shadow_percent=50)
    keys = [f"r-{i}" for i in range(200)]
    plain = router(FakeScorers(versions=(1,))).answer(*rows(200), keys, [None] * 200)
    shadowed = r.answer(*rows(200), keys, [None] * 200)
    np.testing.assert_array_equal(shadowed.probability, plain.probability)
    assert shadowed.served_by == ["risk_scorer:1"] * 200
    diffs = shadowed.shadow_differences["risk_scorer:3"]
    assert 60 < len(diffs) < 140
    np.testing.assert_allclose(diffs, 0.002, atol=1e-6)


def test_failing_shadow_candidate_changes_nothing():
    scorers = FakeScorers(versions=(1,), down={"risk_scorer:3"})
    answer = router(scorers, candidate=Target("risk_scorer", 3), shadow_percent=100).answer(
        *rows(4), list("abcd"), [None] * 4)
    assert answer.errors == [None] * 4 and answer.served_by == ["risk_scorer:1"] * 4
    assert answer.shadow_differences == {}


@pytest.mark.parametrize("override, served", [("risk_scorer_lite:1", "risk_scorer_lite:1"),
                                              ("risk_scorer:1", "risk_scorer:1")])
def test_route_override_sends_that_request_where_it_says(override, served):
    answer = router(FakeScorers()).answer(*rows(2), ["a", "b"], [override, None])
    assert answer.served_by == [served, "risk_scorer:2"]


def test_unknown_override_fails_that_row_alone():
    answer = router(FakeScorers()).answer(*rows(2), ["a", "b"], ["candidate", None])
    assert "no candidate is configured" in answer.errors[0].message and answer.errors[1] is None
    assert answer.errors[0].kind == INVALID


def test_version_folders_are_listed_once_per_listing_period_not_per_batch():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    listings = []

    class CountingScorers(FakeScorers):
        def folders(self, model):
            listings.append(model)
            return super().folders(model)

    clock, scorers = Clock(), CountingScorers(versions=(1,))
    r = router(scorers, clock)
    for _ in range(5):
        r.answer(*rows(2), ["a", "b"], [None, None])
    assert listings == ["risk_scorer"]
    scorers.versions = [2, 1]  # published meanwhile
    clock.now = VERSION_LISTING_SECONDS
    assert r.answer(*rows(2), ["a", "b"], [None, None]).served_by == ["risk_scorer:2"] * 2
    assert listings == ["risk_scorer", "risk_scorer"]


def test_client_routes_never_reach_the_version_listing_and_leave_no_state():
    listed = []

    class ListingScorers(FakeScorers):
        def folders(self, model):
            listed.append(model)
            return super().folders(model)

    r = router(ListingScorers())
    routes = ["/", "../..", "/etc", "risk_decision", *(f"model-{i}" for i in range(1000)), 1, True]
    answer = r.answer(*rows(len(routes)), [f"r-{i}" for i in range(len(routes))], routes)
    assert all(e is not None and e.kind == INVALID and e.message.startswith("route: ") for e in answer.errors)
    assert listed == [] and r._listed == {} and r._not_serving == {}


@pytest.mark.parametrize("override", ["risk_scorer:9", "risk_scorer:0", "risk_scorer_lite:2",
                                      "risk_scorer:123456789012345678"])
def test_a_forced_version_that_is_no_version_folder_is_the_callers_invalid_route_and_is_never_called(override):
    scorers = FakeScorers()
    answer = router(scorers).answer(*rows(2), ["a", "b"], [override, None])
    assert answer.errors[0].kind == INVALID
    assert answer.errors[0].message.startswith(f"route: {override.partition(':')[0]} has no version ")
    assert answer.errors[1] is None and answer.served_by[1] == "risk_scorer:2"
    assert [call for call, _ in scorers.calls] == ["risk_scorer:2"]
    assert dict(answer.failed_rows) == {}


def test_forced_rows_are_scored_apart_and_left_out_of_the_analysis_figures():
    scorers = FakeScorers(down={"risk_scorer:1"})
    keys = [f"r-{i}" for i in range(8)]
    overrides = ["candidate", "risk_scorer:1", "candidate", None, None, "risk_scorer:1", None, "primary"]
    answer = router(scorers, candidate=CANDIDATE, canary_percent=100).answer(*rows(8), keys, overrides)
    assert answer.forced == [o is not None for o in overrides]
    assert answer.served_by == ["risk_scorer:2", None, "risk_scorer:2", "risk_scorer:2", "risk_scorer:2", None,
                                "risk_scorer:2", "risk_scorer:2"]
    # The router's own canary rows (3, 4, 6) form one call; forced rows are called apart and not counted.
    assert ("risk_scorer:2", 3) in scorers.calls and ("risk_scorer:2", 2) in scorers.calls
    assert {k: len(v) for k, v in answer.call_seconds.items()} == {"risk_scorer:2": 1}
    assert dict(answer.failed_rows) == {}


def test_forcing_the_configured_candidate_whose_folder_is_gone_is_not_the_callers_mistake():
    scorers = FakeScorers(versions=(2, 1), not_loaded={"risk_scorer:3"})
    answer = router(scorers, candidate=Target("risk_scorer", 3), canary_percent=10).answer(
        *rows(3), ["a", "b", "c"], ["candidate", "risk_scorer:3", "risk_scorer:4"])
    assert [e.kind for e in answer.errors] == [UNAVAILABLE, UNAVAILABLE, INVALID]
    assert "not found" in answer.errors[0].message
    assert answer.errors[2].message == "route: risk_scorer has no version 4 (versions: 1, 2)"


def test_a_failed_primary_leaves_no_reference_cycle_holding_the_batch():
    """A python model's leftover cycles are collected at its stub's teardown, after Triton 2.51's stub freed the
    shared memory its request objects point into: nothing of a batch may wait for the garbage collector."""
    import gc
    import weakref

    class Batch(np.ndarray):
        """An array that can be watched (plain ndarrays take no weak references)."""

    categorical, numeric = rows(4)
    batch = numeric.view(Batch)
    watched = weakref.ref(batch)
    gc.disable()
    try:
        with pytest.raises(InternalError):
            router(FakeScorers(down={"risk_scorer:2"}))._call(PRIMARY, categorical, batch)
        del batch
        assert watched() is None, "the failed call's frames keep the batch alive until a collection"
    finally:
        gc.enable()
