import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.drift import SCORE_FEATURE, DriftMonitor, DriftWatch, Reference, psi
from backends.feature_spec import CategoricalFeature, FeatureSpec


@pytest.mark.parametrize("expected, actual, low, high", [
    ([10, 20, 30, 40], [10, 20, 30, 40], 0.0, 1e-12),
    ([10, 20, 30, 40], [20, 40, 60, 80], 0.0, 1e-12),  # same shares, more records
    ([25, 25, 25, 25], [40, 30, 20, 10], 0.1, 0.25),
    ([50, 50, 0, 0], [0, 0, 50, 50], 5.0, 50.0),
])
def test_psi_is_zero_for_equal_shares_and_grows_with_the_shift(expected, actual, low, high):
    assert low <= psi(expected, actual) <= high


def test_psi_of_an_empty_side_is_not_a_number():
    assert math.isnan(psi([0, 0], [1, 2]))


def test_psi_refuses_different_bins():
    with pytest.raises(ValueError, match="bins differ"):
        psi([1, 2], [1, 2, 3])


@given(st.lists(st.integers(0, 1000), min_size=2, max_size=20).filter(lambda c: sum(c) > 0),
       st.lists(st.integers(0, 1000), min_size=2, max_size=20).filter(lambda c: sum(c) > 0))
def test_psi_is_symmetric_and_never_negative(a, b):
    a, b = a[:min(len(a), len(b))], b[:min(len(a), len(b))]
    if sum(a) == 0 or sum(b) == 0:
        return
    assert psi(a, b) >= 0 and np.isclose(psi(a, b), psi(b, a))


# --- live records against the training data -------------------------------------------------------------------

SPEC = FeatureSpec((CategoricalFeature("purpose", {"car": 1, "tv": 2}, 0),), ("amount",))


def training(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    categorical = rng.choice([1, 2], size=(n, 1), p=[0.7, 0.3]).astype(np.int64)
    numeric = rng.normal(3000, 500, size=(n, 1)).astype(np.float32)
    scores = rng.uniform(0, 0.6, size=(n, 1)).astype(np.float32)
    return categorical, numeric, scores


def monitor(sample_rate=1.0, max_rows=20_000):
    reference = Reference.build(SPEC, *training())
    return DriftMonitor(Reference.from_json(reference.to_json()), ("purpose",), ("amount",), sample_rate, max_rows)


def test_live_records_like_the_training_data_show_no_drift():
    watched = monitor()
    watched.observe(*training(seed=1))
    assert all(value < 0.05 for value in watched.psi().values()), watched.psi()


def test_a_shifted_feature_shows_drift_and_the_others_do_not():
    watched = monitor()
    categorical, numeric, scores = training(seed=1)
    watched.observe(categorical, numeric + 1000, scores)
    values = watched.psi()
    assert values["amount"] > 0.2 and values["purpose"] < 0.05 and values[SCORE_FEATURE] < 0.05


def test_only_the_sampled_stride_is_counted_across_batches():
    watched = monitor(sample_rate=0.1)
    categorical, numeric, scores = training(seed=1)
    for start in range(0, 2000, 7):  # batches of 7 records: the stride carries over
        watched.observe(categorical[start:start + 7], numeric[start:start + 7], scores[start:start + 7])
    assert watched.sampled == 200


def test_memory_is_bounded_by_halving_the_counts():
    watched = monitor(max_rows=1000)
    for seed in range(10):
        watched.observe(*training(seed=seed))
    assert watched._score.sum() <= 1000
    assert watched.psi()["amount"] < 0.05


def test_an_unknown_category_index_and_a_nan_score_are_counted_safely():
    watched = monitor()
    watched.observe(np.array([[99]], np.int64), np.array([[3000.0]], np.float32), np.array([[np.nan]], np.float32))
    assert watched.sampled == 1 and np.isnan(watched.psi()[SCORE_FEATURE])


class _Monitor:
    def __init__(self, fail_after=None):
        self.batches, self.fail_after = 0, fail_after

    def observe(self, categorical, numeric, probability):
        self.batches += 1
        if self.fail_after is not None and self.batches > self.fail_after:
            raise RuntimeError("bad bins")

    def psi(self):
        return {"score": float(self.batches)}


def test_drift_watch_publishes_at_most_every_interval_and_stops_on_its_first_error():
    now, published, logged = [0.0], [], []
    monitor = _Monitor(fail_after=3)
    watch = DriftWatch(monitor, published.append, 5.0, logged.append, clock=lambda: now[0])
    rows = np.zeros((2, 1))
    for t in (0.0, 1.0, 6.0):
        now[0] = t
        watch(rows, rows, rows)
    assert published == [{"score": 1.0}, {"score": 3.0}]
    watch(rows, rows, rows)  # fails: logged, then no more watching
    watch(rows, rows, rows)
    assert monitor.batches == 4 and len(logged) == 1 and "bad bins" in logged[0]
    watch(rows, rows, np.zeros((0, 1)))
