"""The rules that turn a hostile soak's measurements into verdicts: a guarantee holds only when it was measured and
kept, and the printed table shows every path, phase and verdict."""
import pytest

from s2t.soak.hostile import report as soak_report
from s2t.soak.hostile.report import ANSWERED, FAILED, NOT_SENT, PHASES, UNANSWERED, Sample


@pytest.mark.parametrize("elapsed, phase", [(0.0, "before"), (9.99, "before"), (10.0, "during"), (29.9, "during"),
                                            (30.0, "after"), (99.0, "after")])
def test_phase_of_splits_the_run_at_the_flood_window(elapsed, phase):
    assert soak_report.phase_of(elapsed, before_s=10.0, during_s=20.0) == phase


def test_path_summary_counts_outcomes_and_takes_percentiles_of_answered_requests_only():
    samples = ([Sample("before", ANSWERED, i / 1000) for i in range(1, 101)]
               + [Sample("during", FAILED, 5.0, "RESOURCE_EXHAUSTED"), Sample("during", UNANSWERED, None, "timed out"),
                  Sample("during", ANSWERED, 0.002), Sample("during", NOT_SENT)])
    summary = soak_report.path_summary(samples)
    assert summary["before"][ANSWERED] == 100 and summary["before"]["p50_ms"] == pytest.approx(50.5)
    assert summary["before"]["p99_ms"] == pytest.approx(99.01), "interpolated as every figure of the bench is"
    during = summary["during"]
    assert (during[ANSWERED], during[FAILED], during[UNANSWERED], during[NOT_SENT]) == (1, 1, 1, 1)
    assert during["p99_ms"] == pytest.approx(2.0), "a failed request's latency is not a served latency"
    assert during["errors"] == ["RESOURCE_EXHAUSTED", "timed out"]
    assert summary["after"][ANSWERED] == 0 and summary["after"]["p99_ms"] is None


def _paths(**phase_counts):
    """{path: summary} with the given (answered, failed, unanswered, p99) in every phase."""
    answered, failed, unanswered, p99 = phase_counts.get("counts", (10, 0, 0, 50.0))
    row = {ANSWERED: answered, FAILED: failed, UNANSWERED: unanswered, NOT_SENT: 0, "p50_ms": p99, "p99_ms": p99,
           "errors": []}
    return {"risk_pipeline_http": {phase: dict(row) for phase in PHASES}}


@pytest.mark.parametrize("counts, floods, holds", [
    ((10, 0, 0, 50.0), {}, True),
    ((10, 3, 0, 50.0), {}, True),  # an error status is an answer
    ((10, 0, 1, 50.0), {}, False),
    ((10, 0, 0, 50.0), {"big_records": {"unanswered": 2}}, False),
    ((0, 0, 0, None), {}, None),  # nothing sent: not measured, never "holds"
])
def test_every_request_answered_counts_valid_and_flood_requests(counts, floods, holds):
    assert soak_report.every_request_answered(_paths(counts=counts), floods)["holds"] is holds


@pytest.mark.parametrize("p99, target, holds", [(50.0, 100.0, True), (150.0, 100.0, False), (None, 100.0, None)])
def test_latency_targets_compare_each_phase_p99_with_the_path_target(p99, target, holds):
    verdict = soak_report.latency_targets_kept(_paths(counts=(10, 0, 0, p99)), {"risk_pipeline_http": target})
    assert verdict["holds"] is holds
    if holds is False:
        assert "risk_pipeline_http before: p99 150 ms > 100 ms" in verdict["detail"]


def test_a_failed_valid_request_breaks_valid_requests_succeeded_and_names_where():
    verdict = soak_report.valid_requests_succeeded(_paths(counts=(10, 2, 0, 50.0)))
    assert verdict["holds"] is False and "risk_pipeline_http during: 2 failed" in verdict["detail"]


@pytest.mark.parametrize("before, after, holds", [
    ({"tritonserver": 1, "llm_0_0@1": 2}, {"tritonserver": 1, "llm_0_0@1": 2}, True),
    ({"tritonserver": 1, "llm_0_0@1": 2}, {"tritonserver": 1, "llm_0_0@1": 3}, False),  # a stub was replaced
    ({"tritonserver": 1, "llm_0_0@1": 2}, {"tritonserver": 1}, False),  # a stub is gone
    ({}, {}, None),
])
def test_no_restarts_compares_the_pids_of_the_server_and_every_stub(before, after, holds):
    assert soak_report.no_restarts(before, after)["holds"] is holds


MIB = 2**20


@pytest.mark.parametrize("probes, holds", [
    ([{"probe": "HTTP GET /v2/logging", "refused": True}], True),
    ([{"probe": "HTTP GET /v2/logging", "refused": True}, {"probe": "gRPC LogSettings", "refused": False}], False),
    ([], None)])
def test_admin_apis_are_restricted_only_when_every_probe_was_refused(probes, holds):
    assert soak_report.apis_restricted(probes)["holds"] is holds


def test_labels_and_leftovers_verdicts():
    assert soak_report.labels_from_configuration(0, 100)["holds"] is True
    assert soak_report.labels_from_configuration(3, 100) == {"holds": False,
                                                             "detail": "3 of 100 bogus routes became metric labels"}
    assert soak_report.labels_from_configuration(0, 0)["holds"] is None
    assert soak_report.nothing_left("processes", [])["holds"] is True
    left = soak_report.nothing_left("processes", ["123 risk_stream_0_0"])
    assert left["holds"] is False and "123 risk_stream_0_0" in left["detail"]


SUPERVISOR_PAGE = ['s2t_supervisor_reloads_total{model="risk_stream",reason="BACKEND"} 1',
                   's2t_supervisor_reloads_total{model="llm",reason="stub"} 2', "s2t_models_given_up 0",
                   "s2t_server_hangs_total 0", "s2t_server_restarts_total 0"]


def test_supervisor_totals_sum_each_counter_over_its_labels_and_leave_out_what_the_page_lacks():
    assert soak_report.supervisor_totals(SUPERVISOR_PAGE) == {"s2t_supervisor_reloads_total": 3.0,
                                                              "s2t_server_hangs_total": 0.0,
                                                              "s2t_server_restarts_total": 0.0}
    assert soak_report.supervisor_totals(["s2t_server_restarts_total 2"]) == {"s2t_server_restarts_total": 2.0}
    assert soak_report.supervisor_totals([]) == {}


RESTARTS, RELOADS, HANGS = "s2t_server_restarts_total", "s2t_supervisor_reloads_total", "s2t_server_hangs_total"


@pytest.mark.parametrize("before, after, holds, detail", [
    ({RESTARTS: 0, HANGS: 0}, {RESTARTS: 0, HANGS: 0}, True, "no reload, restart or hang"),
    # No reload yet has no sample on the page: absent counts as zero at either end.
    ({RESTARTS: 0, HANGS: 0}, {RESTARTS: 0, HANGS: 0, RELOADS: 1}, False, f"{RELOADS} 0 -> 1"),
    ({RESTARTS: 0, HANGS: 0, RELOADS: 2}, {RESTARTS: 0, HANGS: 0, RELOADS: 2}, True, "no reload, restart or hang"),
    ({RESTARTS: 0, HANGS: 0}, {RESTARTS: 2, HANGS: 1}, False, f"{RESTARTS} 0 -> 2; {HANGS} 0 -> 1"),
    ({RESTARTS: 1, HANGS: 0}, {RESTARTS: 1, HANGS: 0}, True, "no reload, restart or hang"),  # before the run: not ours
    ({}, {RESTARTS: 0}, None, "the supervisor's metrics were not read at the start and the end"),
    ({RESTARTS: 0}, {}, None, "the supervisor's metrics were not read at the start and the end"),
])
def test_no_reload_or_restart_compares_the_supervisors_counters_at_the_start_and_the_end(before, after, holds,
                                                                                         detail):
    assert soak_report.no_reload_or_restart(before, after) == {"holds": holds, "detail": detail}


def _mixed(invalid=(50, 50), valid=(200, 200), unexpected=()):
    return {"sent": invalid[0] + valid[0], "invalid": {"sent": invalid[0], "as_expected": invalid[1]},
            "valid": {"sent": valid[0], "as_expected": valid[1]}, "unexpected": list(unexpected)}


VALID_HOLD = {"holds": True, "detail": "none failed"}
VALID_FAIL = {"holds": False, "detail": "risk_pipeline_grpc during: 3 failed"}


@pytest.mark.parametrize("floods, valid, holds, in_detail", [
    ({"invalid_records": _mixed(), "malformed_bytes": _mixed((20, 20), (80, 80))}, VALID_HOLD, True,
     "70 invalid requests each refused naming its field; 280 valid beside them scored"),
    ({"invalid_records": _mixed((50, 49), unexpected=["wrong_type (grpc): INTERNAL boom"]),
      "malformed_bytes": _mixed()}, VALID_HOLD, False,
     "invalid_records: 1 of 50 invalid requests not refused naming their field; "
     "invalid_records: wrong_type (grpc): INTERNAL boom"),
    ({"invalid_records": _mixed(valid=(200, 197)), "malformed_bytes": _mixed()}, VALID_HOLD, False,
     "invalid_records: 3 of 200 valid requests not scored"),
    # The caller errors all answered right, but the valid paths beside them failed: not answered alone.
    ({"invalid_records": _mixed(), "malformed_bytes": _mixed()}, VALID_FAIL, False,
     "valid paths: risk_pipeline_grpc during: 3 failed"),
    ({"invalid_records": _mixed(), "malformed_bytes": {"sent": 0, "outcomes": {"still running after its time": 1}}},
     VALID_HOLD, None, "no invalid request sent by malformed_bytes"),
    ({"invalid_records": {}, "malformed_bytes": {}}, VALID_HOLD, None,
     "no invalid request sent by invalid_records, malformed_bytes"),
    # What was measured failed: that is reported even where another flood sent nothing.
    ({"invalid_records": _mixed((50, 0)), "malformed_bytes": {}}, VALID_HOLD, False,
     "50 of 50 invalid requests not refused"),
])
def test_caller_errors_are_answered_alone_only_when_each_is_refused_naming_its_field_and_valid_traffic_is_served(
        floods, valid, holds, in_detail):
    verdict = soak_report.caller_errors_answered_alone(floods, valid)
    assert verdict["holds"] is holds
    assert in_detail in verdict["detail"]


def test_table_shows_every_path_phase_rss_flood_and_verdict():
    report = {"seconds": 60, "phases_s": {"before": 15, "during": 30, "after": 15},
              "latency_targets_ms": {"risk_pipeline_http": 1000.0}, "paths": _paths(),
              "rss": {"serving": {p: {"max": 300 * MIB, "last": 290 * MIB} for p in PHASES}},
              "floods": {"bogus_routes": {"sent": 100, "outcomes": {"StatusCode.INVALID_ARGUMENT": 100}}},
              "services": {"grpc_port_served_by": "s2t_grpc_front (pid 42)"},
              "rss_trend": {"serving": {"samples": 30, "from_s": 6.0, "to_s": 60.0, "start_bytes": 300 * MIB,
                                        "end_bytes": 301 * MIB, "slope_bytes_per_hour": 66 * MIB,
                                        "projected_growth": 15.84, "projected_hours": 72.0}},
              "rss_trend_by_phase": {"serving (after)": {"samples": 8, "from_s": 45.0, "to_s": 60.0,
                                                         "start_bytes": 301 * MIB, "end_bytes": 301 * MIB,
                                                         "slope_bytes_per_hour": 0, "projected_growth": 0.0,
                                                         "projected_hours": 72.0}},
              "rss_trend_by_load": {"service (valid load)": {
                  "samples": 16, "from_s": 7.0, "to_s": 60.0, "stretches_s": [[7.0, 15.0], [46.0, 60.0]],
                  "steps_bytes": [3 * MIB], "start_bytes": 330 * MIB, "end_bytes": 333 * MIB,
                  "slope_bytes_per_hour": 0, "projected_growth": 0.0, "projected_hours": 72.0}},
              "load_average": {"start": [0.5, 0.4, 0.3], "end": [3.25, 1.0, 0.5], "cpus": 2},
              "supervisor_before": ["s2t_server_restarts_total 0"], "supervisor": ["s2t_server_restarts_total 1"],
              "verdicts": {"rss_projection": {"holds": True, "detail": "ok"}, "admin_apis_restricted":
                           {"holds": False, "detail": "open"}, "latency_targets_kept": {"holds": None, "detail": "-"}}}
    text = soak_report.table(report)
    assert sum(line.startswith("risk_pipeline_http") for line in text.splitlines()) == 3
    assert "300/290" in text and "bogus_routes" in text and "100 x StatusCode.INVALID_ARGUMENT" in text
    assert "admin_apis_restricted                   FAILS" in text and "not measured" in text
    assert "public gRPC port served by: s2t_grpc_front (pid 42)" in text
    assert ("service (valid load)     330.0 -> 333.0 MiB fitted over 7-15 + 46-60 s, +3.0 MiB from one stretch to "
            "the next, +0.0 MiB/h, +0.0% at 72 h") in text
    assert "serving (whole run)      300.0 -> 301.0 MiB fitted over 6-60 s, +66.0 MiB/h, +1584.0% at 72 h" in text
    assert "serving (after)          301.0 -> 301.0 MiB fitted over 45-60 s, +0.0 MiB/h, +0.0% at 72 h" in text

    assert "load average (1, 5, 15 min): at the start 0.50 0.40 0.30, at the end 3.25 1.00 0.50 on 2 CPUs" in text
    assert "supervisor at the start: s2t_server_restarts_total 0" in text
    assert "supervisor at the end: s2t_server_restarts_total 1" in text


@pytest.mark.parametrize("outcomes, holds, in_detail", [
    ({"HTTP 413": 9, "HTTP 400": 1}, True, "9 x HTTP 413"),
    ({"HTTP 500": 10}, False, "10 x HTTP 500 ('{\"error\":\"failed to parse\"}'), not a 4xx"),
    ({"HTTP 413": 9, "no answer: ConnectionResetError": 1}, False, "1 x no answer"),
    ({"not sent (flood time over)": 2}, None, "no oversized body"),
])
def test_oversized_bodies_must_each_be_refused_with_a_4xx(outcomes, holds, in_detail):
    flood = {"sent": sum(outcomes.values()), "outcomes": outcomes, "answers": {"HTTP 500": '{"error":"failed to parse"}'}}
    verdict = soak_report.oversized_bodies_refused(flood)
    assert verdict["holds"] is holds and in_detail in verdict["detail"], verdict


def test_phase_bounds_follow_the_phases_in_order():
    assert soak_report.phase_bounds({"after": 15.0, "before": 15.0, "during": 30.0}) == {
        "before": (0.0, 15.0), "during": (15.0, 45.0), "after": (45.0, 60.0)}
