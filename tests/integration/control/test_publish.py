"""`s2t publish`: only a valid artifact that passes the parity gate becomes a version, and atomically."""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import MODEL_REPOSITORY, S2T
from s2t.backends.runtime.repository_layout import version_numbers
from s2t.gate import model_config
from s2t.gate.reference_cache import CACHE_ENV
from s2t.control.publish import ParityGate, PublishError, publish
from s2t.control.version_store import VersionStore



@pytest.fixture
def repository(tmp_path, built_artifacts):
    """A copy of the served repository with the versions `make` published."""
    dest = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    assert version_numbers(dest / "risk_scorer")
    return dest


@pytest.fixture
def gate(built_artifacts):
    return ParityGate(built_artifacts["saved_model"], built_artifacts["data"])


def versions(repository):
    return version_numbers(repository / "risk_scorer")


def test_valid_artifact_becomes_the_next_version_with_its_record(repository, gate, built_artifacts):
    new = versions(repository)[-1] + 1
    assert publish("risk_scorer", built_artifacts["onnx"], repository, gate) == new
    version = repository / "risk_scorer" / str(new)
    assert (version / "model.onnx").read_bytes() == built_artifacts["onnx"].read_bytes()
    record = json.loads((version / "publish.json").read_text())
    assert record["version"] == new and record["parity"]["rows"] == 1000 and record["parity"]["max_abs"] <= 1e-5
    assert not any(VersionStore(repository).staging.iterdir())
    assert VersionStore(repository).history("risk_scorer")[-1]["version"] == new
    assert model_config.check_repositories([repository]) == []


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[: len(data) // 2], "not a valid ONNX model"),
    (lambda data: b"\x00garbage" * 100, "not a valid ONNX model"),
])
def test_truncated_or_corrupt_artifact_is_refused_and_nothing_changes(repository, gate, built_artifacts, tmp_path,
                                                                      damage, reason):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(damage(built_artifacts["onnx"].read_bytes()))
    before = versions(repository)
    with pytest.raises(PublishError, match=reason):
        publish("risk_scorer", bad, repository, gate)
    assert versions(repository) == before


def test_artifact_failing_parity_is_refused_with_the_table(repository, gate, built_artifacts, tmp_path):
    model = onnx.load(str(built_artifacts["onnx"]))
    biggest = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    biggest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(biggest) * np.float32(1.5), biggest.name))
    drifted = tmp_path / "drifted.onnx"
    onnx.save(model, str(drifted))
    before = versions(repository)
    with pytest.raises(PublishError, match="parity gate failed") as refused:
        publish("risk_scorer", drifted, repository, gate)
    assert "FAIL" in str(refused.value)
    assert versions(repository) == before


def test_artifact_not_fitting_the_config_is_refused(repository, gate, built_artifacts, tmp_path):
    model = onnx.load(str(built_artifacts["onnx"]))
    model.graph.output[0].name = "score"
    for node in model.graph.node:
        node.output[:] = ["score" if o == "probability" else o for o in node.output]
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    before = versions(repository)
    with pytest.raises(PublishError, match="output 'probability' is not in renamed.onnx"):
        publish("risk_scorer", renamed, repository, gate)
    assert versions(repository) == before


def test_publish_command_prints_the_new_version_last(repository, built_artifacts):
    done = subprocess.run([str(S2T), "publish", "risk_scorer", str(built_artifacts["onnx"]), "--repository",
                           str(repository), "--saved-model", str(built_artifacts["saved_model"]), "--data",
                           str(built_artifacts["data"])], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(versions(repository)[-1])
    assert re.search(r"risk_scorer: validating .* \(parity gate .*: \d+\.\d s", done.stderr), done.stderr


def test_publish_into_another_repository_of_the_same_legacy_model_never_starts_tensorflow(repository, built_artifacts,
                                                                                       tmp_path):
    """The legacy side comes from the gate's cache, shared between repositories: with TensorFlow made unimportable,
    a publish of the same legacy model on the same data into a second repository still passes the gate (the
    candidate scored again), and one on a data file with one byte changed needs TensorFlow again."""
    def run_publish(repo, data, env):
        return subprocess.run([str(S2T), "publish", "risk_scorer", str(built_artifacts["onnx"]), "--repository",
                               str(repo), "--saved-model", str(built_artifacts["saved_model"]), "--data",
                               str(data)], capture_output=True, text=True, timeout=300, env=env)

    assert os.environ.get(CACHE_ENV), "the session shares one reference cache"
    first = run_publish(repository, built_artifacts["data"], dict(os.environ))  # computes it unless a test did
    assert first.returncode == 0, first.stderr
    other = tmp_path / "other" / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, other, ignore=shutil.ignore_patterns("__pycache__"))
    blocker = tmp_path / "no-tensorflow" / "tensorflow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("tensorflow was imported")\n')
    without_tf = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    second = run_publish(other, built_artifacts["data"], without_tf)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().splitlines()[-1] == str(versions(other)[-1])
    assert json.loads((other / "risk_scorer" / str(versions(other)[-1]) / "publish.json").read_text()
                      )["parity"]["rows"] == 1000
    changed = tmp_path / "germancredit.csv"
    content = bytearray(built_artifacts["data"].read_bytes())
    last_row = content.rstrip().rindex(b"\n") + 1
    duration = content.index(b",", last_row) + 1  # the last row's duration in months: one digit changed
    content[duration] = ord("2") if content[duration] != ord("2") else ord("3")
    changed.write_bytes(bytes(content))
    third = run_publish(other, changed, without_tf)
    assert third.returncode != 0 and "tensorflow was imported" in third.stderr, third.stderr
