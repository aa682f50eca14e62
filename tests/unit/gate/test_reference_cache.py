"""The parity gate's cache of the legacy model's scores: keyed by content, recomputed on any change, never trusted
when torn, and the candidate's side always computed."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from s2t.gate import parity, reference_cache
from s2t.gate.reference_cache import CACHE_ENV, reference, reference_key


def fake_saved_model(folder: Path) -> Path:
    """The files a SavedModel has; their bytes are all the key reads, so no TensorFlow is needed to make them."""
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph " * 50)
    (folder / "fingerprint.pb").write_bytes(b"\x01\x02\x03")
    (folder / "variables" / "variables.index").write_bytes(b"index")
    (folder / "variables" / "variables.data-00000-of-00001").write_bytes(bytes(range(256)))
    (folder / "training_report.json").write_text('{"auc": 0.8}')
    return folder


@pytest.fixture
def model_and_data(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n3,4\n")
    return fake_saved_model(tmp_path / "risk_model"), data


class Counted:
    """A stand-in for TensorFlow's scoring that counts how often the gate asked for it."""

    def __init__(self, scores):
        self.scores, self.calls = np.asarray(scores, np.float32), 0

    def __call__(self):
        self.calls += 1
        return self.scores


def flip_byte(path: Path, offset: int = 0) -> None:
    content = bytearray(path.read_bytes())
    content[offset % len(content)] ^= 0x01
    path.write_bytes(bytes(content))


@pytest.mark.parametrize("change, same", [
    (lambda m, d: flip_byte(m / "saved_model.pb"), False),
    (lambda m, d: flip_byte(m / "variables" / "variables.data-00000-of-00001", 200), False),
    (lambda m, d: flip_byte(m / "fingerprint.pb", 2), False),
    (lambda m, d: flip_byte(d, 5), False),
    (lambda m, d: (m / "assets").mkdir() or (m / "assets" / "vocab.txt").write_text("A11\n"), False),
    (lambda m, d: (m / "variables" / "variables.index").rename(m / "variables.index"), False),
    (lambda m, d: (m / "training_report.json").write_text('{"auc": 0.9}'), True),
    (lambda m, d: None, True),
], ids=["graph", "weights", "fingerprint", "data", "added-asset", "moved-file", "training-report", "nothing"])
def test_key_changes_with_every_byte_of_model_and_data_and_only_with_them(model_and_data, change, same):
    saved_model, data = model_and_data
    before = reference_key(saved_model, data)
    change(saved_model, data)
    assert (reference_key(saved_model, data) == before) is same


def test_key_names_the_content_not_the_paths(model_and_data, tmp_path):
    saved_model, data = model_and_data
    elsewhere = tmp_path / "copy"
    shutil.copytree(saved_model, elsewhere / "model")
    shutil.copy(data, elsewhere / "other-name.csv")
    assert reference_key(elsewhere / "model", elsewhere / "other-name.csv") == reference_key(saved_model, data)


def test_key_changes_with_the_signature(model_and_data):
    saved_model, data = model_and_data
    assert reference_key(saved_model, data, "serving_default") != reference_key(saved_model, data, "predict")


def test_key_of_a_folder_without_files_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.csv").write_text("a\n")
    with pytest.raises(FileNotFoundError, match="no SavedModel files"):
        reference_key(tmp_path / "empty", tmp_path / "data.csv")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flipped_byte_of_any_model_file_misses_the_cache(model_and_data, data):
    saved_model, data_file = model_and_data
    files = sorted(p for p in saved_model.rglob("*") if p.is_file() and p.name != "training_report.json")
    path = data.draw(st.sampled_from(files))
    offset = data.draw(st.integers(0, len(path.read_bytes()) - 1))
    before = reference_key(saved_model, data_file)
    flip_byte(path, offset)
    try:
        assert reference_key(saved_model, data_file) != before
    finally:
        flip_byte(path, offset)  # the same model again for the next example
    assert reference_key(saved_model, data_file) == before


def test_repeated_reference_is_computed_once_and_recomputed_after_a_changed_byte(model_and_data, tmp_path):
    saved_model, data = model_and_data
    compute = Counted([0.1, 0.7])
    first, hit_first = reference(saved_model, data, 2, compute, tmp_path / "cache")
    second, hit_second = reference(saved_model, data, 2, compute, tmp_path / "cache")
    assert (hit_first, hit_second, compute.calls) == (False, True, 1)
    np.testing.assert_array_equal(first, second)
    flip_byte(saved_model / "variables" / "variables.data-00000-of-00001", 17)
    _, hit_changed = reference(saved_model, data, 2, compute, tmp_path / "cache")
    assert (hit_changed, compute.calls) == (False, 2)
    flip_byte(data, 3)
    _, hit_data = reference(saved_model, data, 2, compute, tmp_path / "cache")
    assert (hit_data, compute.calls) == (False, 3)


@pytest.mark.parametrize("entry", [b"", b"not numpy at all", "other-rows", "integers", "pickled"])
def test_a_torn_or_foreign_entry_is_recomputed_and_replaced(model_and_data, tmp_path, entry):
    saved_model, data = model_and_data
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / f"{reference_key(saved_model, data)}.npy"
    if entry == "other-rows":
        np.save(path, np.zeros(3, np.float32))
    elif entry == "integers":
        np.save(path, np.array([0, 1]))
    elif entry == "pickled":
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    else:
        path.write_bytes(entry)
    compute = Counted([0.25, 0.5])
    scores, hit = reference(saved_model, data, 2, compute, cache)
    assert not hit and compute.calls == 1
    np.testing.assert_array_equal(scores, compute.scores)
    np.testing.assert_array_equal(np.load(path), compute.scores)


def test_a_cache_that_cannot_be_written_still_gives_the_scores(model_and_data, tmp_path):
    saved_model, data = model_and_data
    blocked = tmp_path / "a-file"
    blocked.write_text("a file where the cache folder would be")
    compute = Counted([0.3, 0.4])
    for calls in (1, 2):
        scores, hit = reference(saved_model, data, 2, compute, blocked / "cache")
        assert not hit and compute.calls == calls
        np.testing.assert_array_equal(scores, compute.scores)


def test_no_cache_directory_computes_every_time(model_and_data):
    saved_model, data = model_and_data
    compute = Counted([0.5, 0.5])
    for calls in (1, 2):
        assert reference(saved_model, data, 2, compute, None)[1] is False and compute.calls == calls


@pytest.mark.parametrize("env, default, expected", [
    (None, None, None),
    (None, "control/reference", "control/reference"),
    ("/shared/reference", "control/reference", "/shared/reference"),
    ("/shared/reference", None, "/shared/reference"),
    ("  ", "control/reference", "control/reference"),
])
def test_the_environment_names_the_cache_over_the_callers_default(monkeypatch, env, default, expected):
    if env is None:
        monkeypatch.delenv(CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(CACHE_ENV, env)
    got = reference_cache.cache_dir(Path(default) if default else None)
    assert got == (Path(expected) if expected else None)


def test_gate_takes_the_legacy_side_from_the_cache_and_scores_the_candidate_every_time(
        monkeypatch, tmp_path, built_artifacts, german_credit_data):
    """The fake SavedModel cannot be loaded: the gate answers only because the reference came from the cache, and a
    reference moved away from the candidate's scores fails it, so the candidate was scored."""
    saved_model = fake_saved_model(tmp_path / "risk_model")
    data, onnx_path = built_artifacts["data"], built_artifacts["onnx"]
    candidate = parity.onnx_scores(onnx_path, *parity.packed_inputs(onnx_path, german_credit_data.columns))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "shared"))
    reference_cache.store(tmp_path / "shared", reference_key(saved_model, data), candidate)
    assert parity.run(saved_model, onnx_path, data, localise=False).passed
    reference_cache.store(tmp_path / "shared", reference_key(saved_model, data), candidate + 0.01)
    report = parity.run(saved_model, onnx_path, data, localise=False)
    assert not report.passed and report.comparisons[0].max_abs == pytest.approx(0.01, abs=1e-6)
