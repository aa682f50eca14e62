"""`llm` versions without a server: a version folder's GGUF and settings, the pinned version policy as the model's
own consumer, and publish (with the GGUF check in its child process) / promote / rollback on a private copy."""
import json
import shutil

import pytest

from s2t.backends.llm.engine import packaged_model_path
from s2t.backends.llm.version_settings import (MODEL_FILE, SETTINGS_FILE, VersionSettingsError, parse_settings,
                                               version_parameters)
from s2t.control import primary
from s2t.control.config_edit import ConfigEditError, set_pinned_versions
from s2t.control.publish import ArtifactRefused, publish
from s2t.control.rollout import Rollout, RolloutError, canary, promote, rollback, rollback_plan
from s2t.control.version_store import VersionStore
from s2t import triton_config
from tests.conftest import LLM_REPOSITORY


@pytest.mark.parametrize("text, expected", [
    ('{"default_max_tokens": 24}', {"default_max_tokens": "24"}),
    ('{"stream_by_default": false, "chat_template": true}', {"stream_by_default": "false", "chat_template": "true"}),
    ("{}", {}),
])
def test_version_settings_become_parameter_values(text, expected):
    assert parse_settings(text) == expected


@pytest.mark.parametrize("text, message", [
    ("not json", "settings.json: not JSON"),
    ("[1]", "expected an object of settings, got list"),
    ('{"threads": 4}', "settings.json.threads: unknown"),
    ('{"default_max_tokens": [1]}', "settings.json.default_max_tokens: expected a number"),
])
def test_bad_version_settings_name_the_key_and_the_reason(text, message):
    with pytest.raises(VersionSettingsError, match=message.replace(".", r"\.").replace("[", r"\[")):
        parse_settings(text)


def test_a_version_serves_its_own_gguf_and_settings_over_the_shared_config(tmp_path):
    shared = {"model_path": {"string_value": "/elsewhere.gguf"}, "default_max_tokens": {"string_value": "64"},
              "threads": {"string_value": "1"}}
    assert version_parameters(shared, tmp_path) == shared  # a folder with neither: the config as it is
    (tmp_path / MODEL_FILE).write_bytes(b"GGUF")
    (tmp_path / SETTINGS_FILE).write_text('{"default_max_tokens": 12}')
    merged = version_parameters(shared, tmp_path)
    assert merged["model_path"]["string_value"] == str((tmp_path / MODEL_FILE).resolve())
    assert merged["default_max_tokens"]["string_value"] == "12" and merged["threads"]["string_value"] == "1"
    assert shared["default_max_tokens"]["string_value"] == "64"


@pytest.mark.parametrize("before, versions, after", [
    ("version_policy: { specific: { versions: [ 1 ] } }", [2], "version_policy: { specific: { versions: [ 2 ] } }"),
    ("version_policy: { specific: { versions: [ 1 ] } }", [1, 2],
     "version_policy: { specific: { versions: [ 1, 2 ] } }"),
    ("version_policy: {specific: {versions: [3, 4]}}", [3], "version_policy: {specific: {versions: [ 3 ]}}"),
    ("version_policy: { specific: { versions: 7 } }", [8], "version_policy: { specific: { versions: [ 8 ] } }"),
])
def test_the_pinned_versions_line_is_rewritten_in_place(before, versions, after):
    assert set_pinned_versions(f"# why\n{before}\n", versions) == f"# why\n{after}\n"


def test_a_config_without_pinned_versions_is_refused():
    with pytest.raises(ConfigEditError, match="expected one"):
        set_pinned_versions("version_policy: { all: {} }\n", [2])


@pytest.fixture
def llm_repo(tmp_path):
    repo = tmp_path / "model_repository_llm"
    shutil.copytree(LLM_REPOSITORY / "llm", repo / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def pinned(repo) -> list[int]:
    return sorted(triton_config.load(repo / "llm").version_policy.specific.versions)


@pytest.mark.parametrize("version, standby, listed", [(2, 1, (1, 2)), (2, None, (2,)), (1, 2, (1,)), (3, 3, (3,))])
def test_the_pinned_model_is_its_own_consumer_and_keeps_only_an_older_standby(llm_repo, version, standby, listed):
    (consumer,) = primary.consumers("llm", (llm_repo,))
    assert (consumer.kind, consumer.version) == (primary.PINNED_KIND, 1)
    (change,) = primary.plan("llm", version, (llm_repo,), standby=standby)
    assert change.pinned_versions == listed and change.pinned_version == version
    assert change.in_force({"version_policy": {"specific": {"versions": [str(v) for v in listed]}}})
    assert not change.in_force({"version_policy": {"specific": {"versions": ["1", "2", "3"]}}})


def test_publish_stage_promote_rollback_of_a_gguf_moves_the_pinned_versions(llm_repo, tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"default_max_tokens": 24}))
    assert publish("llm", packaged_model_path(), llm_repo, None, stage=True, settings=settings) == 2
    folder = llm_repo / "llm" / "2"
    assert {p.name for p in folder.iterdir()} == {"model.py", MODEL_FILE, SETTINGS_FILE, "publish.json"}
    record = VersionStore(llm_repo).history("llm")[-1]
    assert record["action"] == "stage" and record["checks"]["check"]["tokens"] >= 1
    assert record["checks"]["settings"] == {"default_max_tokens": "24"}
    assert pinned(llm_repo) == [1]  # staged: validated and in place, not loaded
    rollout = Rollout("llm", llm_repo)
    with pytest.raises(RolloutError, match="no canary"):
        canary(rollout, 2, 10.0, 0.0)
    promote(rollout, 2)
    assert pinned(llm_repo) == [1, 2] and (rollout.state().primary, rollout.state().previous) == (2, 1)
    done = rollback(rollout, rollback_plan(rollout, None))
    assert (done.action, done.target) == ("revert", 1)
    assert pinned(llm_repo) == [1] and rollout.state().primary == 1
    # Rolling forward again loads version 2 alone: a newer standby would take every caller.
    rollback(rollout, rollback_plan(rollout, 2))
    assert pinned(llm_repo) == [2]


@pytest.mark.parametrize("content, message", [
    (b"not a model at all", "not a GGUF file"),
    (None, "llama.cpp cannot load it"),  # the real file cut short: the right magic, then nothing loads
])
def test_a_gguf_that_cannot_serve_is_refused_and_nothing_changes(llm_repo, tmp_path, content, message):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content if content is not None else packaged_model_path().read_bytes()[:100_000])
    config_before = (llm_repo / "llm" / "config.pbtxt").read_text()
    with pytest.raises(ArtifactRefused, match=message):
        publish("llm", bad, llm_repo, None)
    assert VersionStore(llm_repo).served("llm") == [1]
    assert (llm_repo / "llm" / "config.pbtxt").read_text() == config_before
    assert VersionStore(llm_repo).history("llm") == []


def test_a_check_that_runs_over_its_time_limit_refuses_the_file():
    from s2t.control.llm_check import GgufRefused, check_gguf
    with pytest.raises(GgufRefused, match="did not finish within"):
        check_gguf(packaged_model_path(), timeout_s=0.05)


def test_a_promote_killed_after_rewriting_the_pinned_versions_is_undone_by_the_next_command(llm_repo, monkeypatch):
    import os
    import signal
    import subprocess

    from s2t.control import llm_check
    from tests.conftest import S2T
    # The staged version only has to be there: the GGUF check on publish is tested above.
    monkeypatch.setattr(llm_check, "check_gguf", lambda path, **_: {"tokens": llm_check.CHECK_TOKENS})
    publish("llm", packaged_model_path(), llm_repo, None, stage=True)
    monkeypatch.undo()
    killed = subprocess.run([str(S2T), "promote", "llm", "2", "--repository", str(llm_repo)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "S2T_FAULT_POINTS": "control.consumer.llm=kill"})
    assert killed.returncode == -signal.SIGKILL
    rollout = Rollout("llm", llm_repo)
    assert pinned(llm_repo) == [1, 2] and rollout.state().pending["action"] == "promote"
    recovered = rollout.recovered_state()
    # Back to before the step: version 1 alone serves, version 2 is the staged candidate again.
    assert pinned(llm_repo) == [1] and (recovered.primary, recovered.candidate, recovered.pending) == (1, 2, None)
    assert VersionStore(llm_repo).history("llm")[-1]["action"] == "recover"
    promote(rollout, 2)
    assert pinned(llm_repo) == [1, 2] and rollout.state().primary == 2
