import json

import pytest

from s2t.serve.healing import (ErrorRateSettings, ErrorRateWatch, HangSettings, HealPolicy, HealSettings,
                               StuckExecute, SupervisorState, doubling_delay, request_counters, stuck_executes)
from s2t.prometheus_text import parse_metrics
from s2t.serve.keeper import RestartPolicy, restricted_headers

METRICS = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="skill_adapter",version="1"} 90
nv_inference_request_success{model="risk_scorer",version="1"} 10
nv_inference_request_success{model="risk_scorer",version="2"} 5
nv_inference_request_failure{model="skill_adapter",reason="BACKEND",version="1"} 7
nv_inference_request_failure{model="skill_adapter",reason="OTHER",version="1"} 3
nv_inference_request_failure{model="skill_adapter",reason="REJECTED",version="1"} 400
nv_inference_request_failure{model="skill_adapter",reason="CANCELED",version="1"} 9
nv_inference_request_failure{model="risk_scorer",reason="BACKEND",version="2"} 1
"""


def test_request_counters_sum_versions_and_count_only_the_models_own_failures():
    # OTHER (a request Triton could not take), REJECTED (a full queue), CANCELED (the caller): not the model's.
    assert request_counters(parse_metrics(METRICS)) == {"skill_adapter": (90.0, 7.0), "risk_scorer": (15.0, 1.0)}
    assert request_counters(parse_metrics(METRICS), {"risk_scorer"}) == {"risk_scorer": (15.0, 1.0)}


EXECUTES = """# TYPE s2t_execute_started_seconds gauge
s2t_execute_started_seconds{instance="risk_pipeline_0_0",model="risk_pipeline",version="1"} %s
s2t_execute_started_seconds{instance="other_0_0",model="other",version="1"} 0
"""


@pytest.mark.parametrize("started, now, stuck", [
    (0, 1000.0, []),                                                  # idle
    (995.0, 1000.0, []),                                              # running 5 s: within the bound
    (990.0, 1000.0, []),                                              # exactly the bound: not past it
    (989.0, 1000.0, [StuckExecute("risk_pipeline", "risk_pipeline_0_0", 11.0)]),
    (1001.0, 1000.0, []),                                             # a clock step back: not stuck
])
def test_an_execute_running_past_the_bound_is_stuck_and_an_idle_instance_never_is(started, now, stuck):
    assert stuck_executes(parse_metrics(EXECUTES % started), now, HangSettings(seconds=10)) == stuck


def feed(watch, samples):
    """samples: (second, successes so far, failures so far) -> the seconds at which the model was reported."""
    return [t for t, ok, bad in samples if watch.observe({"m": (ok, bad)}, float(t))]


@pytest.mark.parametrize("samples, reported", [
    # 50% failing from second 1 on: the streak starts at 1, reaches 5 s at 6.
    ([(t, 10 * t, 10 * t) for t in range(0, 9)], [6]),
    # 5% failing: never.
    ([(t, 95 * t, 5 * t) for t in range(0, 20)], []),
    # failing for 4 s, one healthy second, failing again: the streak starts over (1-4, then 6..11).
    ([(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4), (5, 104, 4), (6, 105, 5), (7, 106, 6), (8, 107, 7),
      (9, 108, 8), (10, 109, 9), (11, 110, 10)], [11]),
    # seconds without traffic neither break nor extend proof of failure: 10 failures in 1..2, then silence, then one.
    ([(0, 0, 0), (1, 0, 5), (2, 0, 10), (3, 0, 10), (4, 0, 10), (5, 0, 10), (6, 0, 11)], [6]),
])
def test_a_model_is_reported_after_failing_over_the_threshold_for_the_whole_span(samples, reported):
    assert feed(ErrorRateWatch(ErrorRateSettings(threshold=0.1, seconds=5, min_failures=5)), samples) == reported


def test_a_handful_of_failures_is_noise_not_a_failing_model():
    samples = [(t, 0, min(t, 3)) for t in range(0, 10)]
    assert feed(ErrorRateWatch(ErrorRateSettings(min_failures=5)), samples) == []


def test_counters_that_restart_after_a_reload_are_not_negative_traffic():
    watch = ErrorRateWatch()
    watch.observe({"m": (1000, 0)}, 0)
    assert watch.observe({"m": (3, 0)}, 1) == []
    assert watch._streaks == {}


def test_heals_back_off_doubling_then_give_up_at_the_cap():
    policy = HealPolicy(HealSettings(first_delay_seconds=1, max_delay_seconds=4, max_attempts=4, quiet_seconds=100))
    assert policy.ask("m", "stub_died", 0) == "now"
    assert policy.ask("m", "stub_died", 0.5) == "later"
    assert policy.due(0.9) == [] and policy.due(1.0) == [("m", "stub_died")]
    assert policy.ask("m", "stub_died", 1.0) == "now"
    assert policy.ask("m", "stub_died", 2.5) == "later", "second delay is 2 s"
    assert policy.ask("m", "stub_died", 3.0) == "now"
    assert policy.ask("m", "stub_died", 6.9) == "later" and policy.ask("m", "stub_died", 7.0) == "now"
    assert policy.ask("m", "stub_died", 20) == "give_up"
    assert policy.ask("m", "stub_died", 1000) == "give_up", "given up stays given up"
    assert policy.ask("other", "error_rate", 20) == "now"


def test_a_failed_reload_is_retried_on_schedule_and_a_quiet_period_starts_the_count_over():
    policy = HealPolicy(HealSettings(first_delay_seconds=1, max_attempts=2, quiet_seconds=60))
    assert policy.ask("m", "stub_died", 0) == "now"
    policy.failed("m", "stub_died", 0)
    assert policy.due(0.5) == [] and policy.due(1.0) == [("m", "stub_died")]
    assert policy.ask("m", "stub_died", 1.0) == "now"
    assert policy.ask("m", "stub_died", 70) == "now", "quiet for 69 s: healthy again, attempts start over"
    assert policy.attempts("m") == 1


@pytest.mark.parametrize("retries_before, first, most, delay", [
    (0, 1, 30, 1), (1, 1, 30, 2), (4, 1, 30, 16), (5, 1, 30, 30), (60, 1, 30, 30), (-1, 0.5, 30, 0.5), (3, 2, 5, 5),
])
def test_the_delay_doubles_from_the_first_up_to_the_most(retries_before, first, most, delay):
    assert doubling_delay(retries_before, first, most) == delay


def test_server_restarts_back_off_and_stop_at_the_cap_within_the_window():
    policy = RestartPolicy(max_restarts=4, window_seconds=100, first_delay_seconds=1, max_delay_seconds=3)
    # The first at once: a crash costs only the start; a server that keeps dying waits longer each time.
    assert [policy.next_delay(t) for t in (0, 10, 20, 30)] == [0, 1, 2, 3]
    assert policy.next_delay(40) is None
    assert policy.next_delay(100.5) == 3, "the first restart left the window"


def test_the_state_file_and_the_metrics_say_what_was_done(tmp_path):
    state = SupervisorState(path=tmp_path / ".model_repository.s2t" / "supervisor.json")
    state.server_started(42)
    state.record("reload", "skill_adapter", "stub_died")
    state.record("reload", "skill_adapter", "stub_died")
    state.record("reload", "risk_scorer", "error_rate")
    state.record("reload_failed", "risk_scorer", "error_rate", "read-only file system")
    state.record("server_restart", detail="exited with code -9")
    state.record("server_hung", "risk_pipeline", "hung", "risk_pipeline_0_0's execute has not returned for 11 s")
    saved = json.loads(state.path.read_text())
    assert saved["server_pid"] == 42 and saved["server_restarts"] == 1
    assert {"model": "skill_adapter", "reason": "stub_died", "count": 2} in saved["reloads"]
    assert saved["reload_failures"] == {"risk_scorer": 1}
    assert saved["server_hangs"] == 1
    assert [e["event"] for e in saved["events"]] == ["reload", "reload", "reload", "reload_failed", "server_restart",
                                                      "server_hung"]
    assert list(state.path.parent.iterdir()) == [state.path], "no temporary file left"
    text = state.prometheus()
    assert 's2t_supervisor_reloads_total{model="skill_adapter",reason="stub_died"} 2' in text
    assert "s2t_server_restarts_total 1" in text
    assert "s2t_server_hangs_total 1" in text
    state.watch({"risk_pipeline", "skill_adapter"})
    state.record("gave_up", "skill_adapter", "error_rate")
    text = state.prometheus()
    assert 's2t_supervisor_given_up{model="risk_pipeline"} 0' in text, "every watched model has the gauge"
    assert 's2t_supervisor_given_up{model="skill_adapter"} 1' in text


def test_the_admin_header_comes_from_the_restricted_api_option():
    command = ["tritonserver", "--http-restricted-api=model-repository:admin-key=s3cret"]
    assert restricted_headers(command) == {"admin-key": "s3cret"}
    assert restricted_headers(["tritonserver"]) == {}


@pytest.mark.parametrize("layout, expected", [
    ({"a/llm/config.pbtxt"}, True),                          # the language model's repository
    ({"a/risk_scorer/config.pbtxt", "b/llm/config.pbtxt"}, True),
    ({"a/risk_scorer/config.pbtxt"}, False),                 # the scorer alone: no API, its port stays closed
    ({"a/llm/1/model.py"}, False),                           # a folder named llm without a config is no model
    ({"a/llm_judge/config.pbtxt"}, False),
    (set(), False),
])
def test_the_openai_api_is_served_only_where_a_repository_holds_its_model(tmp_path, layout, expected):
    from s2t.serve.keeper import serves_openai_model
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    repositories = sorted({str(tmp_path / name.split("/")[0]) for name in layout}) or [str(tmp_path / "a")]
    assert serves_openai_model(repositories) is expected
