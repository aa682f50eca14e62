"""Rollout steps on a private copy of the repositories, without a server: roles of the versions, the consumers'
configs, the history, the control lock under concurrent processes, and durable renames."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from s2t.control import primary, version_store
from s2t.control import rollout as rollout_module
from s2t.control.publish import PublishError, publish
from s2t.control.rollout import Rollout, RolloutError, canary, promote, rollback, rollback_plan
from s2t.control.version_store import VersionStore


@pytest.fixture
def repos(tmp_path, built_artifacts, repositories):
    """A private copy of the repositories with version 1 of risk_scorer only."""
    repo, ensembles = tmp_path / "model_repository", tmp_path / "ensembles"
    shutil.copytree(repositories["model_repository"], repo)
    shutil.copytree(repositories["ensembles"], ensembles)
    return repo, built_artifacts["onnx"]


def served_by_consumers(repo: Path) -> dict[str, int | None]:
    return {c.name: c.version for c in primary.consumers("risk_scorer", (repo, repo.parent / "ensembles"))}


def state(repo):
    return Rollout("risk_scorer", repo).state()


def test_staged_version_is_loaded_but_every_consumer_keeps_the_primary(repos):
    repo, onnx = repos
    staged = publish("risk_scorer", onnx, repo, None, stage=True)
    assert staged == 2 and VersionStore(repo).served("risk_scorer") == [1, 2]
    assert served_by_consumers(repo) == {"risk_router": 1, "risk_pipeline": 1, "risk_pipeline_ensemble": 1}
    assert (state(repo).primary, state(repo).candidate) == (1, 2)


def test_plain_publish_moves_every_consumer_at_once_and_keeps_the_previous_version(repos, monkeypatch):
    repo, onnx = repos
    assert publish("risk_scorer", onnx, repo, None) == 2
    assert served_by_consumers(repo) == {"risk_router": 2, "risk_pipeline": 2, "risk_pipeline_ensemble": 2}
    assert (state(repo).primary, state(repo).previous) == (2, 1)
    publish("risk_scorer", onnx, repo, None)
    # Version 1 was the primary moments ago: without a server to ask, a consumer may still be reloading off it.
    assert VersionStore(repo).served("risk_scorer") == [1, 2, 3] and list(state(repo).draining) == [1]
    later = time.time() + rollout_module.DRAIN_SECONDS + 1
    monkeypatch.setattr(rollout_module, "time", SimpleNamespace(time=lambda: later, monotonic=time.monotonic,
                                                                 sleep=time.sleep))
    publish("risk_scorer", onnx, repo, None)
    assert VersionStore(repo).served("risk_scorer") == [3, 4], "the versions before the previous one are retired"


def test_promote_moves_every_consumer_and_clears_the_split(repos):
    repo, onnx = repos
    publish("risk_scorer", onnx, repo, None, stage=True)
    canary(Rollout("risk_scorer", repo), 2, 10.0, 0.0)
    promote(Rollout("risk_scorer", repo), 2)
    assert served_by_consumers(repo) == {"risk_router": 2, "risk_pipeline": 2, "risk_pipeline_ensemble": 2}
    router = (repo / "risk_router" / "config.pbtxt").read_text()
    assert '"candidate" value: { string_value: "" }' in router and '"canary_percent" value: { string_value: "0" }' in router
    assert (state(repo).primary, state(repo).previous, state(repo).candidate) == (2, 1, None)


def test_rollback_during_a_canary_retires_the_candidate_and_leaves_the_primary(repos):
    repo, onnx = repos
    publish("risk_scorer", onnx, repo, None, stage=True)
    canary(Rollout("risk_scorer", repo), 2, 50.0, 0.0)
    done = rollback(Rollout("risk_scorer", repo), rollback_plan(Rollout("risk_scorer", repo), None))
    assert (done.action, done.target) == ("abort", 1)
    assert served_by_consumers(repo) == {"risk_router": 1, "risk_pipeline": 1, "risk_pipeline_ensemble": 1}
    assert '"candidate" value: { string_value: "" }' in (repo / "risk_router" / "config.pbtxt").read_text()
    # Without a server to confirm the router's reload, the candidate's folder stays until it has drained.
    assert list(state(repo).draining) == [2] and state(repo).candidate is None


def test_rollback_after_a_promotion_serves_the_previous_version_again(repos):
    repo, onnx = repos
    publish("risk_scorer", onnx, repo, None, stage=True)
    promote(Rollout("risk_scorer", repo), 2)
    done = rollback(Rollout("risk_scorer", repo), rollback_plan(Rollout("risk_scorer", repo), None))
    assert (done.action, done.target) == ("revert", 1)
    assert served_by_consumers(repo) == {"risk_router": 1, "risk_pipeline": 1, "risk_pipeline_ensemble": 1}


@pytest.mark.parametrize("step, message", [
    (lambda r: canary(Rollout("risk_scorer", r), 1, 10.0, 0.0), "is the primary"),
    (lambda r: promote(Rollout("risk_scorer", r), 1), "is the primary already"),
    (lambda r: promote(Rollout("risk_scorer", r), 7), "no loaded version 7"),
    (lambda r: rollback_plan(Rollout("risk_scorer", r), None), "only version 1"),
])
def test_impossible_steps_are_refused_and_change_nothing(repos, step, message):
    repo, _ = repos
    before = (repo / "risk_router" / "config.pbtxt").read_text()
    with pytest.raises(RolloutError, match=message):
        step(repo)
    assert (repo / "risk_router" / "config.pbtxt").read_text() == before
    assert VersionStore(repo).history() == []


def test_a_second_stage_is_refused_while_a_candidate_waits(repos):
    repo, onnx = repos
    publish("risk_scorer", onnx, repo, None, stage=True)
    with pytest.raises(PublishError, match="version 2 is staged already"):
        publish("risk_scorer", onnx, repo, None, stage=True)
    assert VersionStore(repo).served("risk_scorer") == [1, 2]


def test_history_that_cannot_be_written_stops_the_command_before_it_acts(repos):
    repo, onnx = repos
    store = VersionStore(repo)
    store.control.mkdir(parents=True, exist_ok=True)
    store.history_file.mkdir()  # appending to it fails, as on a full or read-only disk
    before = (repo / "risk_router" / "config.pbtxt").read_text()
    with pytest.raises(PublishError, match="cannot write the history"):
        publish("risk_scorer", onnx, repo, None)
    assert store.served("risk_scorer") == [1]
    assert (repo / "risk_router" / "config.pbtxt").read_text() == before


def test_a_rename_fsyncs_the_moved_folder_and_both_parents(tmp_path, monkeypatch):
    (tmp_path / "a" / "v").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(version_store.os, "fsync",
                        lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    version_store.durable_rename(tmp_path / "a" / "v", tmp_path / "b" / "v")
    assert synced == [str(tmp_path / "b" / "v"), str(tmp_path / "b"), str(tmp_path / "a")]


# Real processes contending for the control lock, forked from one that imported the commands once (an interpreter
# start and import per worker would cost more than the commands they run).
WORKERS = """
import os, random, sys, traceback
from pathlib import Path
from s2t.control.publish import PublishError, publish
from s2t.control.rollout import Rollout, RolloutError, promote, rollback, rollback_plan
repo, onnx, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])


def work(seed):
    rng, done = random.Random(seed), 0
    for _ in range(4):
        step = rng.choice(["publish", "stage-promote", "rollback"])
        try:
            if step == "publish":
                publish("risk_scorer", onnx, repo, None)
            elif step == "stage-promote":
                promote(Rollout("risk_scorer", repo), publish("risk_scorer", onnx, repo, None, stage=True))
                done += 1
            else:
                rollout = Rollout("risk_scorer", repo)
                rollback(rollout, rollback_plan(rollout, None))
            done += 1
        except (PublishError, RolloutError):
            pass
    return done


children = {}
for seed in range(workers):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.write(write, str(work(seed)).encode())
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    os.close(write)
    children[pid] = read
for pid, read in children.items():
    with os.fdopen(read) as f:
        done = f.read()
    _, status = os.waitpid(pid, 0)
    print("worker", pid, "status", status, "changes", done or 0)
"""


def test_concurrent_rollout_commands_keep_a_served_primary_and_every_history_line(repos):
    repo, onnx = repos
    run = subprocess.run([sys.executable, "-c", WORKERS, str(repo), str(onnx), "6"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    workers = [line.split() for line in run.stdout.splitlines()]
    assert len(workers) == 6 and all(w[3] == "0" for w in workers), run.stderr[-2000:]
    changes = sum(int(w[-1]) for w in workers)
    history = [json.loads(line) for line in VersionStore(repo).history_file.read_text().splitlines()]
    assert len([e for e in history if "outcome" not in e]) == changes, "one history line per change, none lost"
    current = state(repo)
    served = VersionStore(repo).served("risk_scorer")
    assert current.primary in served and (current.previous is None or current.previous in served)
    assert set(served_by_consumers(repo).values()) == {current.primary}


def test_a_rollback_after_a_plain_publish_moves_the_consumers_back_and_keeps_both_folders(repos):
    repo, onnx = repos
    publish("risk_scorer", onnx, repo, None)
    done = rollback(Rollout("risk_scorer", repo), rollback_plan(Rollout("risk_scorer", repo), None))
    assert (done.action, done.target, done.retiring) == ("revert", 1, (2,))
    assert served_by_consumers(repo) == {"risk_router": 1, "risk_pipeline": 1, "risk_pipeline_ensemble": 1}
    # The demoted version drains before its folder goes: the consumers may still be reloading.
    assert VersionStore(repo).served("risk_scorer") == [1, 2] and list(state(repo).draining) == [2]


def _pipeline_parameters(repo: Path) -> dict[str, str]:
    from s2t import triton_config
    params = triton_config.backend_parameters(triton_config.load(repo / "risk_pipeline"))
    return {k: params[k]["string_value"] for k in ("scorer_version", "standby_scorer_version")}


def test_the_pipeline_keeps_the_previous_primary_warm_and_the_live_switch_names_the_primary(repos):
    from s2t.backends.runtime.repository_layout import live_switch_file
    repo, onnx = repos
    switch = live_switch_file(repo, "risk_pipeline")
    publish("risk_scorer", onnx, repo, None)
    assert _pipeline_parameters(repo) == {"scorer_version": "2", "standby_scorer_version": "1"}
    assert json.loads(switch.read_text())["scorer_version"] == 2
    rollback(Rollout("risk_scorer", repo), rollback_plan(Rollout("risk_scorer", repo), None))
    assert json.loads(switch.read_text())["scorer_version"] == 1
    assert _pipeline_parameters(repo) == {"scorer_version": "1", "standby_scorer_version": ""}


def test_a_rollback_switches_the_warm_pipeline_before_it_waits_on_the_server_and_writes_the_switch_once(repos,
                                                                                                        monkeypatch):
    from s2t.backends.runtime.repository_layout import live_switch_file
    repo, onnx = repos
    switch = live_switch_file(repo, "risk_pipeline")
    publish("risk_scorer", onnx, repo, None)
    seen = []
    monkeypatch.setattr(Rollout, "wait_loaded",
                        lambda self, version: seen.append((json.loads(switch.read_text()), switch.stat().st_ino)))
    rollback(Rollout("risk_scorer", repo), rollback_plan(Rollout("risk_scorer", repo), None))
    assert seen == [({"scorer_model": "risk_scorer", "scorer_version": 1}, switch.stat().st_ino)]


@pytest.mark.parametrize("target, live, in_force", [
    (1, {"scorer_version": "2", "standby_scorer_version": "1"}, True),  # warm: the switch alone serves it
    (2, {"scorer_version": "2", "standby_scorer_version": "1"}, True),
    (3, {"scorer_version": "2", "standby_scorer_version": "1"}, False),  # not loaded there: a reload is needed
    (1, {"scorer_version": "1"}, True),
])
def test_a_pipeline_change_is_in_force_when_the_live_instance_keeps_the_version_warm(repos, target, live, in_force):
    repo, _ = repos
    (change,) = [c for c in primary.plan("risk_scorer", target, (repo,)) if c.name == "risk_pipeline"]
    assert change.in_force({"parameters": {k: {"string_value": v} for k, v in live.items()}}) is in_force
