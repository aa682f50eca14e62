import json
import math
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.routing.drift_watch import (DRIFT, NO_DRIFT, NOT_ENOUGH_DATA, SCORE_FEATURE, BinPlan, DriftMonitor, DriftWatch,
                                              Reference, chi_square_quantile, choose_reference, noise_psi, psi, range_labels)
from s2t.backends.records.feature_spec import HASH, INTEGER, CategoricalFeature, FeatureSpec
from s2t.backends.records.string_hash import FAST
from s2t.gate.drift import live_report, metrics_address, table
from tests.conftest import MODEL_REPOSITORY
from tests.unit import python_backend as backend
from tests.unit.python_backend import payloads, request
from tests.unit.http_stand_in import http_stand_in


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
    assert psi(a, b, 0.5) >= 0 and np.isclose(psi(a, b, 0.5), psi(b, a, 0.5))


def test_a_bin_a_small_sample_missed_adds_a_small_term_with_smoothing_and_a_large_one_when_real():
    # The floor of 1e-4 made one empty live bin (share 5% in the reference) worth 0.05 * ln(500) = 0.31 at any size.
    reference = [50, 300, 300, 350]
    small, large = [0, 10, 10, 10], [0, 1000, 1000, 1000]
    assert psi(reference, small) > 0.2
    assert psi(reference, small, 0.5) < 0.1 < 0.2 < psi(reference, large, 0.5)


@pytest.mark.parametrize("dof, quantile", [(1, 10.83), (2, 13.82), (3, 16.27), (5, 20.52), (9, 27.88), (20, 45.31)])
def test_chi_square_quantile_is_the_99_9th_percentile(dof, quantile):
    assert chi_square_quantile(dof) == pytest.approx(quantile, rel=0.06)


def test_noise_level_falls_with_the_sample_and_the_reference():
    assert noise_psi(4, 200, 1000) > noise_psi(4, 2000, 1000) > noise_psi(4, 2000, 100_000)
    assert noise_psi(4, 0, 1000) == float("inf")


@pytest.mark.parametrize("counts, labels, min_sample", [
    ([0, 500, 300, 200], ["new", "a", "b", "c"], 25),  # the unseen bin stays apart and does not set the minimum
    ([0, 900, 90, 5, 5], ["new", "a", "b", "c", "d"], 50),  # c and d (0.5% each) pooled with b: 10%
    ([600, 380, 10, 10], ["a", "b", "c", "d"], 13),  # c and d (2% together) join the smallest bin, b: 40%
])
def test_rare_bins_are_pooled_and_the_minimum_sample_expects_five_records_in_the_rarest(counts, labels, min_sample):
    plan = BinPlan.of(np.array(counts, float), labels)
    assert plan.min_sample == min_sample
    assert plan.reference.sum() == sum(counts)
    assert all(share >= 0.02 or share == 0 for share in plan.reference / plan.reference.sum())


def test_bins_with_shares_under_the_minimum_share_are_pooled_into_one_labelled_bin():
    plan = BinPlan.of(np.array([0, 900, 90, 5, 5], float), ["new", "a", "b", "c", "d"])
    assert plan.labels == ("new", "a", "b | c | d")
    assert list(plan.merge) == [0, 1, 2, 2, 2] and plan.dof == 1


def test_range_labels_say_which_values_each_bin_holds():
    assert range_labels([1.0, 2.5]) == ["<= 1", "(1, 2.5]", "> 2.5"]


# --- a German-Credit-like reference: 1,000 training rows ----------------------------------------------------------

PURPOSE = {"car": 1, "tv": 2, "furniture": 3, "business": 4, "repairs": 5}
HOUSING = {"own": 1, "rent": 2, "free": 3}
SPEC = FeatureSpec((CategoricalFeature("purpose", PURPOSE, 0), CategoricalFeature("housing", HOUSING, 0)),
                   ("amount", "age"))
TRAINING_ROWS = 1000


def training(n=TRAINING_ROWS, seed=0):
    rng = np.random.default_rng(seed)
    categorical = np.column_stack([rng.choice([1, 2, 3, 4, 5], size=n, p=[0.3, 0.28, 0.2, 0.19, 0.03]),
                                   rng.choice([1, 2, 3], size=n, p=[0.7, 0.2, 0.1])]).astype(np.int64)
    numeric = np.column_stack([rng.lognormal(7.8, 0.7, size=n), rng.integers(19, 75, size=n)]).astype(np.float32)
    scores = rng.beta(2, 5, size=(n, 1)).astype(np.float32)
    return categorical, numeric, scores


TRAINING = training()
REFERENCE = Reference.from_json(Reference.build(SPEC, *TRAINING, source="(test)").to_json())


def replay(rows):
    return tuple(part[rows] for part in TRAINING)


def flagged(watched):
    return {name for name, figure in watched.figures().items() if figure.drifted}


@pytest.mark.parametrize("records", [200, 1000, 5000])
@pytest.mark.parametrize("order", ["file", "shuffled", "resampled"])
def test_replaying_the_training_rows_flags_nothing(records, order):
    rng = np.random.default_rng(records)
    rows = np.arange(records) % TRAINING_ROWS
    if order == "shuffled":
        rng.shuffle(rows)
    elif order == "resampled":
        rows = rng.integers(0, TRAINING_ROWS, size=records)
    watched = DriftMonitor(REFERENCE, SPEC)
    for start in range(0, records, 100):
        watched.observe(*replay(rows[start:start + 100]))
        assert flagged(watched) == set(), start
    figures = watched.figures()
    assert {f.sample for f in figures.values()} == {min(records, watched.window_records)}
    assert all(f.state == NO_DRIFT for f in figures.values())


def test_sampling_noise_rarely_exceeds_the_noise_level():
    """Resampled training rows at sizes from the minimum up: the noise level is exceeded about once in 1,000."""
    rng = np.random.default_rng(7)
    over, total = 0, 0
    for trial in range(300):
        watched = DriftMonitor(REFERENCE, SPEC)
        watched.observe(*replay(rng.integers(0, TRAINING_ROWS, size=int(rng.choice([150, 400, 1000, 2000])))))
        for figure in watched.figures().values():
            over += figure.psi > figure.noise_psi
            total += 1
    assert over / total < 0.01, (over, total)


def test_below_the_minimum_sample_nothing_is_flagged_however_far_the_records_moved():
    watched = DriftMonitor(REFERENCE, SPEC)
    categorical, numeric, scores = replay(np.arange(10))
    watched.observe(categorical, numeric * 10, scores)
    figures = watched.figures()
    assert figures["amount"].psi > 1 and figures["amount"].state == NOT_ENOUGH_DATA
    assert flagged(watched) == set()


def _shifted(kind, records=2000, seed=3):
    rng = np.random.default_rng(seed)
    categorical, numeric, scores = (part.copy() for part in replay(rng.integers(0, TRAINING_ROWS, size=records)))
    if kind == "amount scaled x4":
        numeric[:, 0] *= 4
    elif kind == "purpose car doubled":
        others = np.flatnonzero(categorical[:, 0] != 1)
        share = np.mean(categorical[:, 0] == 1)
        categorical[rng.choice(others, size=int(share * records), replace=False), 0] = 1
    elif kind == "unseen housing at 10%":
        categorical[rng.choice(records, size=records // 10, replace=False), 1] = 0
    elif kind == "score shifted":
        scores = np.clip(scores + 0.2, 0, 1)
    return categorical, numeric, scores


@pytest.mark.parametrize("kind, moved", [
    ("amount scaled x4", {"amount"}),
    ("purpose car doubled", {"purpose"}),
    ("unseen housing at 10%", {"housing"}),
    ("score shifted", {SCORE_FEATURE}),
])
def test_a_known_shift_flags_exactly_the_moved_feature_within_the_window(kind, moved):
    watched = DriftMonitor(REFERENCE, SPEC)
    watched.observe(*replay(np.arange(TRAINING_ROWS)))
    categorical, numeric, scores = _shifted(kind)
    watched.observe(categorical, numeric, scores)  # one window of shifted records replaces the training rows
    assert flagged(watched) == moved
    top = watched.figures()[next(iter(moved))].top_bins[0]
    assert abs(top.live_share - top.reference_share) > 0.05


def test_the_window_forgets_records_older_than_its_size():
    watched = DriftMonitor(REFERENCE, SPEC, window_records=500)
    watched.observe(*_shifted("amount scaled x4", records=500))
    assert flagged(watched) == {"amount"}
    watched.observe(*replay(np.arange(500)))
    assert flagged(watched) == set() and watched.figures()["amount"].sample == 500


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=12), st.integers(1, 700))
def test_window_counts_equal_the_counts_of_the_last_records_whatever_the_batches(batch_sizes, window):
    watched = DriftMonitor(REFERENCE, SPEC, window_records=window)
    rows = np.arange(sum(batch_sizes)) % TRAINING_ROWS
    start = 0
    for size in batch_sizes:
        watched.observe(*replay(rows[start:start + size]))
        start += size
    assert watched.sampled == sum(batch_sizes)
    fresh = DriftMonitor(REFERENCE, SPEC, window_records=window)
    fresh.observe(*replay(rows[-window:]))
    for mine, theirs in zip(watched._counts, fresh._counts):
        assert np.array_equal(mine, theirs)


def test_only_the_sampled_stride_is_counted_across_batches():
    watched = DriftMonitor(REFERENCE, SPEC, sample_rate=0.1)
    for start in range(0, 2000, 7):  # batches of 7 records: the stride carries over
        watched.observe(*replay(np.arange(start, min(start + 7, 2000)) % TRAINING_ROWS))
    assert watched.sampled == 200


def test_an_unknown_category_index_and_a_nan_score_are_counted_safely():
    watched = DriftMonitor(REFERENCE, SPEC)
    watched.observe(np.array([[99, 1]], np.int64), np.array([[3000.0, 30]], np.float32),
                    np.array([[np.nan]], np.float32))
    figures = watched.figures()
    assert watched.sampled == 1 and figures[SCORE_FEATURE].sample == 0 and figures["purpose"].sample == 1


# int64 features (any value, negative or up to 2^63) and hash buckets (up to 2^63 of them) beside a vocabulary one.
WIDE_SPEC = FeatureSpec((CategoricalFeature("purpose", PURPOSE, 0), CategoricalFeature("branch", {}, 0, INTEGER),
                         CategoricalFeature("merchant", {}, 0, HASH, 2 ** 63 - 1, FAST)), ("amount",))


def _wide(n, seed, shift=0):
    rng = np.random.default_rng(seed)
    branch = rng.choice([-(2 ** 63), -3, 7, 2 ** 40 + 7, 2 ** 63 - 1], size=n, p=[0.1, 0.2, 0.3, 0.3, 0.1])
    merchant = rng.integers(0, 2 ** 63 - 1, size=n, dtype=np.int64)
    categorical = np.column_stack([rng.choice([1, 2, 3], size=n), branch, merchant]).astype(np.int64)
    if shift:
        categorical[: n // 2, 1] = 7  # half the records moved to one branch
    numeric = rng.lognormal(7.8, 0.7, size=(n, 1)).astype(np.float32)
    return categorical, numeric, rng.beta(2, 5, size=(n, 1)).astype(np.float32)


def test_int64_and_hashed_features_are_binned_by_quantiles_whatever_their_values():
    reference = Reference.from_json(Reference.build(WIDE_SPEC, *_wide(2000, 1)).to_json())
    # Bins by value quantiles, never one count per value: a handful of bins however large or negative the values.
    assert set(reference.categorical) == {"purpose"}
    assert all(1 <= len(reference.numeric[name]) <= 11 for name in ("branch", "merchant"))
    assert sum(reference.numeric["branch"]) == sum(reference.numeric["merchant"]) == 2000
    watched = DriftMonitor(reference, WIDE_SPEC)
    watched.observe(*_wide(2000, 2))
    assert flagged(watched) == set() and watched.figures()["branch"].sample == 2000
    watched.observe(*_wide(2000, 3, shift=1))
    assert flagged(watched) == {"branch"}
    assert watched.figures()["branch"].top_bins[0].label.startswith("(")


def test_a_table_with_a_negative_default_or_large_values_is_binned_as_numbers():
    """A StaticHashTable's values are the column (default -1, or values far apart): binned by quantiles."""
    spec = FeatureSpec((CategoricalFeature("purpose", {"car": 3, "tv": 7}, -1),
                        CategoricalFeature("housing", {"own": 10 ** 12}, 0)), ("amount",))
    rng = np.random.default_rng(6)
    categorical = np.column_stack([rng.choice([3, 7, -1], 500), rng.choice([10 ** 12, 0], 500)]).astype(np.int64)
    reference = Reference.build(spec, categorical, np.ones((500, 1), np.float32), np.full((500, 1), 0.5))
    assert reference.categorical == {} and sum(reference.numeric["purpose"]) == 500
    assert len(reference.numeric["housing"]) <= 11
    watched = DriftMonitor(reference, spec)
    watched.observe(categorical, np.ones((500, 1), np.float32), np.full((500, 1), 0.5, np.float32))
    assert flagged(watched) == set() and watched.figures()["purpose"].sample == 500


def test_a_reference_that_counted_an_int64_feature_per_value_is_refused_clearly():
    old = Reference({"purpose": np.ones(6), "branch": np.ones(8), "merchant": np.ones(8)},
                    {"amount": np.array([1.0])}, {"amount": np.ones(2)}, np.ones(10))
    with pytest.raises(ValueError, match="no bins for the integer feature 'branch' .it counted it per value"):
        DriftMonitor(old, WIDE_SPEC)


def test_scores_of_another_version_than_the_references_are_not_counted():
    published = []
    watch = DriftWatch(DriftMonitor(REFERENCE, SPEC), published.append, 0.01, print, score_source="risk_scorer:2")
    categorical, numeric, scores = replay(np.arange(4))
    watch(categorical, numeric, scores, ["risk_scorer:2", "risk_scorer:3", "risk_scorer_lite:1", "risk_scorer:2"])
    figures = watch.monitor.figures()
    assert figures[SCORE_FEATURE].sample == 2 and figures["purpose"].sample == 4


class _Monitor:
    def __init__(self, fail_after=None):
        self.batches, self.fail_after = 0, fail_after

    def observe(self, categorical, numeric, probability):
        self.batches += 1
        if self.fail_after is not None and self.batches > self.fail_after:
            raise RuntimeError("bad bins")

    def figures(self):
        return {"score": float(self.batches)}


def test_drift_watch_publishes_new_records_at_most_every_interval_and_stops_on_its_first_error():
    now, published, logged = [0.0], [], []
    monitor = _Monitor(fail_after=3)
    watch = DriftWatch(monitor, published.append, 5.0, logged.append, clock=lambda: now[0])
    rows = np.zeros((2, 1))
    for t in (0.0, 1.0, 6.0):
        now[0] = t
        watch(rows, rows, rows)
    assert published == [{"score": 1.0}, {"score": 3.0}]
    now[0] = 20.0
    watch.tick()  # nothing new since: nothing published
    assert len(published) == 2
    watch(rows, rows, rows)  # fails: logged, then no more watching
    watch(rows, rows, rows)
    watch.tick()
    assert monitor.batches == 4 and len(logged) == 1 and "bad bins" in logged[0]
    watch(rows, rows, np.zeros((0, 1)))


def test_the_timer_publishes_a_bursts_last_records_after_traffic_stops():
    published, arrived = [], threading.Event()

    def publish(figures):
        published.append(figures)
        if figures["amount"].sample == 1000:
            arrived.set()

    watch = DriftWatch(DriftMonitor(REFERENCE, SPEC), publish, 0.2, print)
    watch.start()
    try:
        for start in range(0, 1000, 100):  # a burst far shorter than the interval
            watch(*replay(np.arange(start, start + 100)))
        assert arrived.wait(timeout=30), [f["amount"].sample for f in published]
        assert published[0]["amount"].sample <= 100  # the first batch was published at once, the rest by the timer
    finally:
        watch.stop()


def test_the_timer_publishes_the_empty_window_as_not_enough_data():
    published = []
    watch = DriftWatch(DriftMonitor(REFERENCE, SPEC), published.append, 0.1, print)
    watch.start()
    try:
        deadline = time.monotonic() + 30
        while not published and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert published and all(f.state == NOT_ENOUGH_DATA for f in published[0].values())


def test_the_served_versions_own_reference_is_chosen_before_the_training_reference(tmp_path):
    training_file = tmp_path / "risk_router" / "1" / "drift_reference.json"
    training_file.parent.mkdir(parents=True)
    assert choose_reference(tmp_path, "risk_scorer", 2, training_file, "drift_reference.json") is None
    training_file.write_text("{}")
    assert choose_reference(tmp_path, "risk_scorer", 2, training_file, "drift_reference.json") == training_file
    own = tmp_path / "risk_scorer" / "2" / "drift_reference.json"
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    assert choose_reference(tmp_path, "risk_scorer", 2, training_file, "drift_reference.json") == own
    assert choose_reference(tmp_path, "risk_scorer", None, training_file, "drift_reference.json") == training_file


@pytest.mark.parametrize("address, url", [
    ("localhost:8002", "http://localhost:8002/metrics"),
    ("10.0.0.5:9102", "http://10.0.0.5:9102/metrics"),
    ("localhost:8002/", "http://localhost:8002/metrics"),
    ("http://localhost:8002/metrics", "http://localhost:8002/metrics"),
    ("https://triton.example/metrics", "https://triton.example/metrics"),
    # A URL without a path is Triton's metrics page, not its root.
    ("http://localhost:8002", "http://localhost:8002/metrics"),
    ("http://localhost:8002/", "http://localhost:8002/metrics"),
    ("http://proxy.example/triton/metrics", "http://proxy.example/triton/metrics"),
])
def test_the_metrics_address_is_host_port_or_a_url(address, url):
    assert metrics_address(address) == url


METRICS = """# HELP s2t_feature_psi PSI
s2t_feature_psi{feature="amount"} 1.25
s2t_feature_psi{feature="age"} 0.01
s2t_feature_psi{feature="purpose"} nan
s2t_feature_psi_noise{feature="amount"} 0.03
s2t_feature_psi_noise{feature="age"} 0.03
s2t_feature_psi_noise{feature="purpose"} nan
s2t_feature_drift_sample{feature="amount"} 2000
s2t_feature_drift_sample{feature="age"} 2000
s2t_feature_drift_sample{feature="purpose"} 40
s2t_feature_drift_min_sample{feature="amount"} 50
s2t_feature_drift_min_sample{feature="age"} 50
s2t_feature_drift_min_sample{feature="purpose"} 100
s2t_feature_drifted{feature="amount"} 1
s2t_feature_drifted{feature="age"} 0
s2t_feature_drifted{feature="purpose"} 0
s2t_feature_bin_share{bin="<= 900",feature="amount",side="live"} 0.01
s2t_feature_bin_share{bin="<= 900",feature="amount",side="reference"} 0.1
s2t_feature_bin_share{bin="> 7000",feature="amount",side="live"} 0.6
s2t_feature_bin_share{bin="> 7000",feature="amount",side="reference"} 0.1
s2t_feature_drift_window_records 2000
s2t_feature_drift_reference_version 2
s2t_feature_drift_sampled_records 5100
"""


def test_the_report_says_reference_window_sample_state_and_the_top_moved_bins():
    report = live_report(METRICS)
    assert report["reference_version"] == 2 and report["window_records"] == 2000
    assert report["sampled_records"] == 5100
    amount, purpose = report["features"]["amount"], report["features"]["purpose"]
    assert amount["state"] == DRIFT and amount["sample"] == 2000 and amount["noise_psi"] == 0.03
    assert [b["bin"] for b in amount["top_bins"]] == ["> 7000", "<= 900"]
    assert purpose["state"] == NOT_ENOUGH_DATA and purpose["psi"] is None
    assert report["features"]["age"]["state"] == NO_DRIFT
    text = table(report)
    assert "version 2's own" in text and "last 2000 records" in text and "5100 sampled" in text
    assert "> 7000: 10.0% -> 60.0%" in text and "not enough data" in text
    assert text.splitlines()[3].startswith("amount")


# --- risk_router's glue, through the wheel's triton_python_backend_utils (no server) ------------------------------

def test_risk_router_counts_the_primarys_scored_records_and_says_not_enough_data_below_the_minimum(model_repository):
    record = json.loads((MODEL_REPOSITORY.parent / "clients" / "examples" / "record.json").read_text())
    bad = {**record, "features": {**record["features"], "credit_amount": "lots"}}
    pb_utils = backend.backend_utils()
    pb_utils.InferenceRequest.bls.update({
        "risk_scorer": lambda bls: backend.InferenceResponse([backend.Tensor("probability", np.full(
            (len(next(t for t in bls.inputs() if t.name() == "numeric").as_numpy()), 1), 0.3, np.float32))]),
        "risk_decision": lambda bls: backend.InferenceResponse([backend.Tensor("decision", np.full(
            bls.inputs()[0].as_numpy().shape, b"APPROVE", dtype=object))])})
    folder = model_repository / "risk_router"
    router = backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder)
    try:
        responses = router.execute([request(payload=payloads(record, record)), request(payload=payloads(bad))])
        assert [r.has_error() for r in responses] == [False, True]
        families = pb_utils.MetricFamily.families

        def value(name, **labels):
            return next(m._value for m in families[name].metrics if m.labels == labels)

        assert value("s2t_feature_drift_sampled_records") == 2  # the bad record's request is not counted
        assert value("s2t_feature_drift_sample", feature="score") == 2
        assert math.isnan(value("s2t_feature_psi", feature="credit_amount"))  # 2 records: not enough data
        assert value("s2t_feature_drifted", feature="credit_amount") == 0
        assert value("s2t_feature_drift_window_records") == 2000
        # The primary's own score reference when its gated publish wrote one, else the training data's (0).
        own = (model_repository / "risk_scorer" / "1" / "drift_reference.json").is_file()
        assert value("s2t_feature_drift_reference_version") == (1 if own else 0)
    finally:
        drift = router._drift  # finalize lets go of everything the model held
        router.finalize()
    assert not drift._timer.is_alive()


def test_a_tf_example_models_reference_is_built_from_its_gate_data_as_parity_reads_it(tmp_path):
    """Empty cells take the parse default, int64 values of any size and sign and a hashed text are binned, the row
    the model refuses (no age) is left out: what `s2t publish` writes beside such a version."""
    import onnx
    from onnx import TensorProto, helper

    from s2t.gate.drift import build_reference
    from s2t.models.convert import shape_for_serving
    from s2t.models.example_signature import EXAMPLE_INPUT_KEY

    nodes = [helper.make_node("Cast", ["branch"], ["branch_f"], to=TensorProto.FLOAT),
             helper.make_node("Squeeze", ["merchant", "axes"], ["flat"]),
             helper.make_node("StringToHashBucketFast", ["flat"], ["bucket"], num_buckets=8),
             helper.make_node("Cast", ["bucket"], ["bucket_f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["bucket_f", "axes"], ["bucket_col"]),
             helper.make_node("Sum", ["branch_f", "age", "bucket_col"], ["total"]),
             helper.make_node("Sigmoid", ["total"], ["output_0"])]
    graph = helper.make_graph(
        nodes, "tf2onnx", [helper.make_tensor_value_info("branch", TensorProto.INT64, ["n", 1]),
                           helper.make_tensor_value_info("merchant", TensorProto.STRING, ["n", 1]),
                           helper.make_tensor_value_info("age", TensorProto.FLOAT, ["n", 1])],
        [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n", 1])],
        [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")])
    raw = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model, spec = shape_for_serving(raw, {"branch": -1, "merchant": "none"}, {EXAMPLE_INPUT_KEY: "examples"})
    onnx.save(model, str(tmp_path / "model.onnx"))
    rng = np.random.default_rng(4)
    lines = ["age,branch,merchant"]
    for i in range(300):
        branch = "" if i % 10 == 9 else str(rng.choice([-(2 ** 63), -3, 7, 2 ** 63 - 1]))
        age = "" if i == 24 else str(int(rng.integers(18, 80)))
        lines.append(f"{age},{branch},{'' if i % 7 == 6 else 'shop' + str(i % 13)}")
    (tmp_path / "gate.csv").write_text("\n".join(lines) + "\n")

    reference = build_reference(tmp_path / "gate.csv", tmp_path / "model.onnx", tmp_path / "reference.json")

    assert sum(reference.score) == 299 and sum(reference.numeric["branch"]) == 299
    assert len(reference.numeric["branch"]) <= 11 and len(reference.numeric["merchant"]) <= 11
    assert set(reference.categorical) == set()
    DriftMonitor(Reference.from_json((tmp_path / "reference.json").read_text()), spec)


class _RecordingFamily(backend.MetricFamily):
    """The stub's MetricFamily whose metrics write every `set` into one shared log, in order."""

    log: list = []

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the stub's spelling
        metric = super().Metric(labels, buckets)
        family, log = self.name, self.log

        def recorded_set(value, _set=metric.set):
            log.append(family)
            _set(value)
        metric.set = recorded_set
        return metric


def test_the_sampled_count_is_published_after_every_figure_it_stands_for():
    """A reader that sees a publication's sampled count sees all of that publication's figures: Triton's metrics page
    can be scraped between two of the gauges a publication sets, and `s2t drift` (and tests) take the count as the
    sign that the figures cover every record sent."""
    from s2t.backends.routing.router_metrics import DriftMetrics

    monitor = DriftMonitor(REFERENCE, SPEC, window_records=500)
    monitor.observe(*(part[:300] for part in TRAINING))
    _RecordingFamily.log = []
    metrics = DriftMetrics(_RecordingFamily, monitor.plans, 500, 0)
    _RecordingFamily.log.clear()
    metrics.publish(monitor.figures())
    log = _RecordingFamily.log
    assert log.count("s2t_feature_drift_sampled_records") == 1
    assert log[-1] == "s2t_feature_drift_sampled_records", log[-5:]
    assert {"s2t_feature_psi", "s2t_feature_psi_noise", "s2t_feature_drifted", "s2t_feature_bin_share"} <= set(log)


def test_a_publication_slower_than_the_interval_is_never_overtaken_by_the_next():
    """Handing the gauges over can outlast the publish interval on a loaded machine: a later publication must not
    run beside it (the older one's last gauges would land after the newer's), and the records that arrived
    meanwhile are published once it is done."""
    now, order = [0.0], []
    first_started, release = threading.Event(), threading.Event()

    def publish(figures):
        order.append(("start", figures["score"]))
        if len(order) == 1:
            first_started.set()
            assert release.wait(timeout=30)
        order.append(("end", figures["score"]))

    monitor = _Monitor(fail_after=100)
    watch = DriftWatch(monitor, publish, 1.0, print, clock=lambda: now[0])
    rows = np.zeros((2, 1))
    slow = threading.Thread(target=watch, args=(rows, rows, rows))
    slow.start()
    assert first_started.wait(timeout=30)
    now[0] = 5.0  # an interval and more later, while the first publication is still handing its gauges over
    watch(rows, rows, rows)  # a batch: counted, returns at once, publishes nothing beside the slow one
    assert order == [("start", 1.0)]
    release.set()
    slow.join(timeout=30)
    watch.tick()  # the timer: the second batch's figures, after the first publication ended
    assert order == [("start", 1.0), ("end", 1.0), ("start", 2.0), ("end", 2.0)]


# --- `s2t drift --metrics-url` against a real HTTP page ------------------------------------------------------------

@pytest.fixture
def metrics_page():
    """A metrics endpoint on a free port: /metrics serves what the test sets; any other path a page of no series."""
    served = {"/metrics": ""}
    with http_stand_in(lambda request: (200, served.get(request.path, "<html>not the metrics</html>").encode())
                       ) as port:
        yield port, served


def drift_cli(*args):
    from click.testing import CliRunner

    from s2t.cli import main
    return CliRunner().invoke(main, ["drift", *args])


def test_a_metrics_url_without_a_path_reads_the_metrics_page(metrics_page):
    port, served = metrics_page
    served["/metrics"] = METRICS
    result = drift_cli("--metrics-url", f"http://127.0.0.1:{port}", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["features"]["amount"]["state"] == DRIFT


@pytest.mark.parametrize("address", ["http://127.0.0.1:{port}", "127.0.0.1:{port}", "http://127.0.0.1:{port}/other"])
def test_a_page_without_drift_series_is_an_error_naming_its_url(metrics_page, address):
    port, served = metrics_page
    served["/metrics"] = 'nv_inference_count{model="risk_pipeline",version="1"} 5\n'
    result = drift_cli("--metrics-url", address.format(port=port))
    assert result.exit_code == 1, result.output
    url = metrics_address(address.format(port=port))
    assert f"{url} has no s2t_feature_* series" in result.output
