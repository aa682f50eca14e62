"""`s2t canary llm` without a server: llm_router holds the split and is a consumer of llm like risk_router of
risk_scorer; the candidate is loaded (listed in llm's pinned versions) before the router names it and unloaded
after the router stops naming it; promote and rollback after a canary keep both in step."""
import shutil

import pytest

from s2t import triton_config
from s2t.control import primary
from s2t.control.split_config import CanaryError
from s2t.control.rollout import Rollout, RolloutError, canary, promote, rollback, rollback_plan
from s2t.control.status import collect, table
from tests.conftest import LLM_REPOSITORY


@pytest.fixture
def llm_repo(tmp_path):
    """llm and llm_router, with a second llm version in place (the same files: a folder is what is checked here)."""
    repo = tmp_path / "model_repository_llm"
    for name in ("llm", "llm_router"):
        shutil.copytree(LLM_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "llm" / "1", repo / "llm" / "2")
    return repo


def pinned(repo) -> list[int]:
    return sorted(triton_config.load(repo / "llm").version_policy.specific.versions)


def split(repo) -> dict[str, str]:
    params = triton_config.backend_parameters(triton_config.load(repo / "llm_router"))
    return {k: params[k]["string_value"] for k in ("primary", "candidate", "canary_percent")}


def test_llm_router_is_a_consumer_of_llm_beside_llm_itself(llm_repo):
    found = {c.name: (c.kind, c.version) for c in primary.consumers("llm", (llm_repo,))}
    assert found == {"llm": (primary.PINNED_KIND, 1), "llm_router": (primary.ROUTER_KIND, 1)}


def test_canary_loads_the_candidate_and_splits_then_off_unloads_it(llm_repo):
    rollout = Rollout("llm", llm_repo)
    settings = canary(rollout, 2, 50.0, 0.0)
    assert settings.describe() == "50% llm:1, 50% llm:2"
    assert pinned(llm_repo) == [1, 2]
    assert split(llm_repo) == {"primary": "llm:1", "candidate": "llm:2", "canary_percent": "50"}
    assert (rollout.state().primary, rollout.state().candidate) == (1, 2)
    canary(rollout, None, 0.0, 0.0)
    assert pinned(llm_repo) == [1] and split(llm_repo)["candidate"] == ""
    assert rollout.state().candidate == 2  # stays staged, as a scorer's candidate does


def test_promote_after_a_canary_moves_the_primary_and_clears_the_split(llm_repo):
    rollout = Rollout("llm", llm_repo)
    canary(rollout, 2, 50.0, 0.0)
    promote(rollout, 2)
    assert pinned(llm_repo) == [1, 2]
    assert split(llm_repo) == {"primary": "llm:2", "candidate": "", "canary_percent": "0"}
    done = rollback(rollout, rollback_plan(rollout, None))
    assert (done.action, done.target) == ("revert", 1)
    assert pinned(llm_repo) == [1] and split(llm_repo)["primary"] == "llm:1"


def test_rollback_during_a_canary_aborts_it_and_unloads_the_candidate(llm_repo):
    rollout = Rollout("llm", llm_repo)
    canary(rollout, 2, 25.0, 0.0)
    done = rollback(rollout, rollback_plan(rollout, None))
    assert (done.action, done.retiring) == ("abort", (2,))
    assert pinned(llm_repo) == [1] and split(llm_repo) == {"primary": "llm:1", "candidate": "",
                                                            "canary_percent": "0"}
    assert rollout.state().candidate is None


@pytest.mark.parametrize("version, percent, shadow, message", [
    (2, 0.0, 10.0, "no shadow for a generating model"),
    (1, 10.0, 0.0, "is the primary"),
    (7, 10.0, 0.0, "has no version 7"),
])
def test_a_canary_that_cannot_be_done_is_refused_and_changes_nothing(llm_repo, version, percent, shadow, message):
    before = split(llm_repo)
    with pytest.raises((RolloutError, CanaryError), match=message):
        canary(Rollout("llm", llm_repo), version, percent, shadow)
    assert split(llm_repo) == before and pinned(llm_repo) == [1]


def test_each_phase_keeps_what_the_router_names_loaded(llm_repo):
    """Loads before the router switches, unloads after: a router never names a version that is not loaded."""
    canary(Rollout("llm", llm_repo), 2, 50.0, 0.0)
    # Aborting: the router stops naming 2 first, then llm drops it.
    changes = [c for c in primary.plan("llm", 1, (llm_repo,), dict(primary.NO_SPLIT)) if c.text != c.path.read_text()]
    assert [[c.name for c in phase] for phase in primary.phases(changes)] == [["llm_router"], ["llm"]]
    # Serving 3 instead of 1 and 2: llm lists 1, 2 and 3 (loads 3), the router switches, llm lists only 3.
    shutil.copytree(llm_repo / "llm" / "1", llm_repo / "llm" / "3")
    changes = primary.plan("llm", 3, (llm_repo,), dict(primary.NO_SPLIT))
    steps = primary.phases(changes)
    assert [[(c.name, c.pinned_versions) for c in phase] for phase in steps] == [
        [("llm", (1, 2, 3))], [("llm_router", ())], [("llm", (3,))]]


def test_status_shows_the_llm_canary(llm_repo):
    canary(Rollout("llm", llm_repo), 2, 50.0, 0.0)
    status = collect(llm_repo, history_lines=0)
    assert status["models"]["llm_router"]["split"] == "50% llm:1, 50% llm:2"
    assert status["models"]["llm"]["consumers"]["llm_router"] == 1
    roles = {v["version"]: v["role"] for v in status["models"]["llm"]["versions"]}
    assert roles == {1: "primary", 2: "candidate"}
    assert "split: 50% llm:1, 50% llm:2" in table(status) and "breaker" not in table(status)
