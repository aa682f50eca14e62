from pathlib import Path

import pytest

from s2t.serve.supervisor import MISSING_CHECKS, DeathWatch, Stub, parse_stub

ARGV = ["/tmp/b/python/triton_python_backend_stub", "/repo/risk_scorer/2/model.onnx", "shm", "1048576", "1048576",
        "4242", "/tmp/b/python", "336", "risk_scorer_0_0", "/tmp/b/onnxruntime"]


def stub(pid, model="risk_scorer", version="2", instance="risk_scorer_0_0"):
    return Stub(pid, model, version, instance, Path(f"/repo/{model}/{version}/model.onnx"))


def test_stub_command_line_names_model_version_and_instance():
    assert parse_stub(7, ARGV) == stub(7)
    assert parse_stub(7, ["/usr/bin/python3", "x.py"]) is None


def look(watch, current, ready=True):
    return watch.update({s.pid: s for s in current}, lambda model, version: ready)


def test_a_stub_gone_while_its_version_is_ready_is_dead_after_two_looks():
    watch = DeathWatch()
    look(watch, [stub(1), stub(2, "skill_adapter", "1", "skill_adapter_0_0")])
    assert look(watch, [stub(2, "skill_adapter", "1", "skill_adapter_0_0")]) == []
    dead = look(watch, [stub(2, "skill_adapter", "1", "skill_adapter_0_0")])
    assert dead == [stub(1)] and MISSING_CHECKS == 2
    assert look(watch, [stub(2, "skill_adapter", "1", "skill_adapter_0_0")]) == [], "reported once"


def test_a_replaced_stub_is_not_dead():
    watch = DeathWatch()
    look(watch, [stub(1)])
    for _ in range(3):
        assert look(watch, [stub(9)]) == []


def test_a_stub_of_an_unloaded_version_is_not_dead():
    watch = DeathWatch()
    look(watch, [stub(1)])
    for _ in range(3):
        assert look(watch, [], ready=False) == []


@pytest.mark.parametrize("comes_back", [True, False])
def test_a_stub_missing_once_is_only_suspect(comes_back):
    watch = DeathWatch()
    look(watch, [stub(1)])
    look(watch, [])
    assert look(watch, [stub(1)] if comes_back else [stub(5)]) == []


def test_a_stub_being_reloaded_is_not_judged_again_until_it_is_back_or_the_grace_ends():
    watch = DeathWatch()
    watch.update({1: stub(1)}, lambda m, v: True, now=0)
    watch.update({}, lambda m, v: True, now=0.2)
    assert watch.update({}, lambda m, v: True, now=0.4) == [stub(1)]
    watch.update({7: stub(7)}, lambda m, v: True, now=0.6)
    watch.update({}, lambda m, v: True, now=0.8)
    assert watch.update({}, lambda m, v: True, now=1.0) == [stub(7)], "back up, then dead again: judged again"
    assert watch.update({}, lambda m, v: True, now=1.2) == []


def test_the_config_autocomplete_stub_is_not_an_instance():
    argv = ARGV[:8] + ["risk_scorer", "/tmp/b/onnxruntime"]
    assert parse_stub(7, argv) is None


def test_a_reload_that_does_not_bring_the_stub_back_within_the_grace_is_reported_again():
    from s2t.serve.supervisor import RELOAD_GRACE_SECONDS
    watch = DeathWatch()
    watch.update({1: stub(1)}, lambda m, v: True, now=0)
    watch.update({}, lambda m, v: True, now=0.2)
    assert watch.update({}, lambda m, v: True, now=0.4) == [stub(1)]
    assert watch.update({}, lambda m, v: True, now=0.4 + RELOAD_GRACE_SECONDS - 0.1) == []
    assert watch.update({}, lambda m, v: True, now=0.4 + RELOAD_GRACE_SECONDS) == [stub(1)]


def test_a_server_too_slow_to_say_whether_a_version_is_ready_keeps_the_stub_under_watch():
    watch = DeathWatch()
    watch.update({1: stub(1)}, lambda m, v: True)
    for _ in range(3):
        assert watch.update({}, lambda m, v: None) == []
    watch.update({}, lambda m, v: True)
    assert watch.update({}, lambda m, v: True) == [stub(1)]


def test_a_stub_missing_on_two_looks_that_are_not_consecutive_is_not_dead():
    watch = DeathWatch()
    look(watch, [stub(1)])
    for _ in range(3):
        assert look(watch, []) == [], "missing once: only suspect"
        assert look(watch, [stub(1)]) == [], "back: no longer suspect"
