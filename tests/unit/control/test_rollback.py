"""Rollback of a model whose newest folder is its primary (a `latest` version policy): the newer folders are
retired (kept for a roll-forward), through the same step as every other rollback."""
import json
from pathlib import Path

import pytest

from s2t.control.rollout import Rollout, RolloutError, rollback, rollback_plan
from s2t.control.version_store import VersionStore


@pytest.fixture
def repository(tmp_path):
    repo = tmp_path / "model_repository"
    model = repo / "risk_scorer"
    for version in (1, 2, 3):
        (model / str(version)).mkdir(parents=True)
        (model / str(version) / "model.onnx").write_text(f"v{version}")
    (model / "config.pbtxt").write_text('name: "risk_scorer"\n')
    return repo


def served(repo: Path) -> list[int]:
    return VersionStore(repo).served("risk_scorer")


def roll_back(repo: Path, to: int | None = None):
    rollout = Rollout("risk_scorer", repo)
    return rollback(rollout, rollback_plan(rollout, to))


def test_rollback_retires_the_newest_version_and_keeps_it_for_later(repository):
    done = roll_back(repository)
    assert (done.action, done.primary, done.target, done.retiring) == ("revert", 3, 2, (3,))
    assert served(repository) == [1, 2]
    assert VersionStore(repository).retired("risk_scorer") == [3]
    assert (VersionStore(repository).retired_dir("risk_scorer") / "3" / "model.onnx").read_text() == "v3"


def test_rollback_to_an_older_version_retires_every_newer_one(repository):
    done = roll_back(repository, to=1)
    assert done.retiring == (3, 2) and served(repository) == [1]


def test_rollback_to_a_retired_version_rolls_forward(repository):
    roll_back(repository)
    done = roll_back(repository, to=3)
    assert (done.target, done.restoring, done.retiring) == (3, True, ())
    assert served(repository) == [1, 2, 3]


def test_version_numbers_are_never_reused_after_a_rollback(repository):
    roll_back(repository)
    assert VersionStore(repository).next_version("risk_scorer") == 4


@pytest.mark.parametrize("to, message", [(3, "version 3 is already served"), (9, "has no version 9")])
def test_impossible_rollback_is_refused_and_changes_nothing(repository, to, message):
    with pytest.raises(RolloutError, match=message):
        roll_back(repository, to=to)
    assert served(repository) == [1, 2, 3]


def test_single_version_cannot_be_rolled_back(repository):
    roll_back(repository, to=1)
    with pytest.raises(RolloutError, match="nothing to roll back to"):
        roll_back(repository)


def test_every_rollback_is_recorded_with_who_when_and_what(repository):
    roll_back(repository)
    roll_back(repository, to=3)
    history = VersionStore(repository).history("risk_scorer")
    assert [(e["action"], e["from"], e["to"]) for e in history] == [("rollback", 3, 2), ("rollback", 2, 3)]
    assert all(e["by"] and e["at"].endswith("Z") for e in history)
    lines = VersionStore(repository).history_file.read_text().splitlines()
    assert [json.loads(line)["action"] for line in lines] == ["rollback", "rollback"]
