"""`s2t soak` in a short run: the report names every serving process, counts answers, and computes growth."""
import json
import subprocess

from s2t.soak.hostile.floods import LOAD_REFUSAL
from tests.conftest import ROOT, S2T
from s2t.errors import GATE_REFUSED



def test_short_soak_reports_rss_of_the_server_and_every_stub_and_no_errors(built_artifacts, tmp_path):
    report = tmp_path / "soak.json"
    done = subprocess.run([str(S2T), "soak", "--minutes", "0.1", "--rate", "50", "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert report.is_file(), done.stdout + done.stderr
    result = json.loads(report.read_text())
    assert result["error_count"] == 0, result["errors"]
    assert result["sent"] == result["answered"] and result["sent"] >= 240
    processes = set(result["samples"][-1]["rss"])
    assert "tritonserver" in processes and {"skill_adapter_0_0@1", "risk_decision_0_0@1"} <= processes
    assert any(p.startswith("risk_scorer_0_0@") for p in processes) and "serving tree" in processes
    # A run this short still samples enough for a fit: every process's RSS fitted and projected to 72 hours.
    assert len(result["samples"]) >= 20
    assert set(result["rss_trend"]) == processes
    assert all(isinstance(fit["projected_growth"], float) and fit["projected_hours"] == 72
               for fit in result["rss_trend"].values()), result["rss_trend"]
    verdicts = result["verdicts"]
    assert verdicts["every_request_answered"]["holds"] is True
    assert verdicts["same_tritonserver_process"]["holds"] is True
    assert result["tritonserver"]["start"] == result["tritonserver"]["end"]
    assert "72 h" in done.stdout and "rss_projection" in done.stdout
    # Progress goes to stderr, a line per tenth of the planned seconds on a pipe, with the requests so far.
    progress = [line for line in done.stderr.splitlines() if line.startswith("soak: ")]
    assert 2 <= len(progress) <= 11 and progress[0] == "soak: sent 0, answered 0, errors 0: 0/6 s (0%)"
    assert progress[-1].startswith(f"soak: sent {result['sent']}, ") and ": 6/6 s (100%) after " in progress[-1]
    assert done.stdout.startswith("soak: 6 s at 50 records/s: ") and "/6 s (" not in done.stdout
    # 6 s cannot tell warm-up from a leak, so the projection may go either way; the exit code must say what the
    # verdicts say.
    every = all(v["holds"] is True for v in verdicts.values())
    assert done.returncode == (0 if every else GATE_REFUSED), done.stdout + done.stderr


# Asserted here, under light floods: the verdicts in ASSERTED hold, every valid request on RISK_PATHS is answered,
# idle streams hold their slots while new streams are served, bogus routes are each refused INVALID_ARGUMENT, every
# admin-API probe is answered, no tritonserver restart, and the callers' mistakes (invalid records of every kind over
# HTTP and gRPC, malformed BYTES buffers, gRPC deadlines that expire while the server works, streams cancelled or
# dropped mid-stream) cost no reload, no restart and no valid request; overlong protobuf varints are answered or
# refused; a client holding calls that never send (fewer than the gRPC front's limit, in light floods) leaves a
# second client answered; every classification of a BYTES output is refused and every damaged stream ends. The
# other verdicts (latency targets, the RSS projection, admin APIs restricted, valid requests succeeded, a refusal
# inside a stream leaving the stream's other messages answered) and the llm path beside abandoned requests are only
# checked to be reported, True, False or None with their figures: the report must say what the server does,
# whatever it does.
ASSERTED = ("no_process_restarts", "metric_labels_from_configuration", "no_shm_region_left", "no_process_left",
            "no_reload_or_restart_for_caller_errors", "caller_errors_answered_alone",
            "overlong_varints_answered_alone", "greedy_client_answered_alone")
RISK_PATHS = ("risk_pipeline_http", "risk_pipeline_grpc", "risk_stream", "gateway")


def test_hostile_soak_reports_every_path_phase_and_guarantee_and_leaves_nothing_behind(built_artifacts, tmp_path):
    report = tmp_path / "hostile.json"
    done = subprocess.run([str(S2T), "soak", "--hostile", "--floods", "light", "--minutes", "0.5", "--rate", "4",
                           "--report", str(report)],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert report.is_file(), done.stdout + done.stderr
    result = json.loads(report.read_text())
    print(done.stdout)
    phases = ("before", "during", "after")

    # Structure: every valid path in every phase, every flood, both process groups' RSS, every verdict.
    assert set(result["paths"]) == set(RISK_PATHS) | {"llm"}
    for path, summary in result["paths"].items():
        for phase in phases:
            row = summary[phase]
            assert {"answered", "failed", "unanswered", "not_sent", "p50_ms", "p99_ms", "errors"} <= set(row)
            # A path whose requests are all still in flight (llm behind abandoned requests) counts ticks not sent.
            assert row["answered"] + row["failed"] + row["unanswered"] + row["not_sent"] > 0, (path, phase, row)
    assert set(result["floods"]) == {"idle_streams", "idle_gateway_calls", "big_records", "llm_disconnects",
                                     "bogus_routes", "oversized_bodies", "grpc_deadlines", "cancelled_streams",
                                     "invalid_records", "malformed_bytes", "bytes_classification", "damaged_streams",
                                     "overlong_varints", "greedy_client", "api_probes"}
    assert all(result["floods"][name]["sent"] > 0 for name in result["floods"])
    assert {"serving", "gateway"} == set(result["rss"]) and all(set(r) == set(phases) for r in result["rss"].values())
    assert "tritonserver" in result["pids"]["before"] and any("@" in name for name in result["pids"]["before"])
    assert any(line.startswith("s2t_server_restarts_total ") for line in result["supervisor"]), result["supervisor"]
    verdicts = result["verdicts"]
    assert set(ASSERTED) <= set(verdicts) and {"every_request_answered", "latency_targets_kept", "rss_projection",
                                               "admin_apis_restricted", "valid_requests_succeeded",
                                               "bytes_classification_answered_alone",
                                               "damaged_streams_answered_alone"} <= set(verdicts)
    # The memory rule: the service (the serving tree and the gateway) fitted over each load and projected to 72
    # hours of it, the valid load's two stretches on one line; each group's, each phase's, the whole run's and each
    # process's lines beside it.
    assert set(result["rss_trend_by_load"]) == {"service (valid load)", "service (floods)"}
    valid = result["rss_trend_by_load"]["service (valid load)"]
    assert len(valid["stretches_s"]) == 2 and len(valid["steps_bytes"]) == 1 and valid["projected_growth"] is not None
    floods = result["rss_trend_by_load"]["service (floods)"]
    assert valid["stretches_s"][0][1] < result["phases_s"]["before"] <= floods["from_s"]
    assert set(result["rss_trend_by_group_and_load"]) == {f"{group} ({load})" for group in ("serving", "gateway")
                                                          for load in ("valid load", "floods")}
    assert set(result["rss_trend_by_phase"]) == {f"{group} ({phase})" for group in ("serving", "gateway")
                                                 for phase in phases}
    assert all(fit["samples"] >= 3 and fit["projected_growth"] is not None
               for fit in result["rss_trend_by_phase"].values())
    assert set(result["rss_trend"]) == {"serving", "gateway"}
    assert all(fit["samples"] >= 5 and fit["projected_growth"] is not None for fit in result["rss_trend"].values())
    assert "tritonserver" in result["rss_trend_by_process"] and len(result["load_average"]["start"]) == 3
    assert "tritonserver (floods)" in result["rss_trend_by_process_and_load"]
    assert all(v["holds"] in (True, False, None) and v["detail"] for v in verdicts.values())

    # Asserted: every valid request on the risk paths and the gateway answered, in every phase.
    for path in RISK_PATHS:
        assert all(result["paths"][path][phase]["unanswered"] == 0 for phase in phases), result["paths"][path]
    # Asserted: the idle-stream flood held its streams (every first record answered) and new streams went on being
    # served beside it.
    idle = result["floods"]["idle_streams"]
    assert idle["outcomes"].get("first record answered") == idle["sent"] and idle["unanswered"] == 0
    assert result["paths"]["risk_stream"]["during"]["answered"] > 0
    # Asserted: bogus routes are the callers' mistake, each answered on its own.
    routes = result["floods"]["bogus_routes"]["outcomes"]
    assert routes.get("StatusCode.INVALID_ARGUMENT", 0) > 0, routes
    # On a busy machine the gRPC front may refuse one for its caller's share of the calls in flight (retryable).
    assert set(routes) <= {"StatusCode.INVALID_ARGUMENT", "not sent (flood time over)", LOAD_REFUSAL}, routes
    # Asserted: every admin-API probe got an answer (refused or not, that is the admin_apis_restricted verdict).
    assert result["floods"]["api_probes"]["unanswered"] == 0
    # Asserted: every invalid record, of each kind over both protocols, refused naming its field, and every malformed
    # BYTES buffer naming `payload`; the valid requests sent beside them scored.
    invalid = result["floods"]["invalid_records"]
    assert invalid["invalid"]["sent"] == invalid["invalid"]["as_expected"] > 0, invalid["unexpected"]
    assert invalid["valid"]["sent"] == invalid["valid"]["as_expected"] > 0, invalid["unexpected"]
    named = {label.split(": ")[0] for label in invalid["outcomes"] if " naming " in label}
    assert named == {f"{kind} ({protocol})" for kind in ("missing_feature", "wrong_type", "not_json", "over_64_kib",
                                                           "long_request_id") for protocol in ("http", "grpc")}
    malformed = result["floods"]["malformed_bytes"]
    assert malformed["outcomes"].get("malformed_bytes: HTTP 400 naming payload") == malformed["invalid"]["sent"] > 0
    assert malformed["valid"]["sent"] == malformed["valid"]["as_expected"] > 0, malformed["unexpected"]
    # The callers that give up did give up while the server worked, and the streams went away mid-stream; what the
    # server made of it is the verdicts' (no restart, no reload, valid requests answered).
    assert result["floods"]["grpc_deadlines"]["outcomes"].get("gave up (its deadline expired)", 0) > 0
    streams = result["floods"]["cancelled_streams"]["outcomes"]
    assert set(streams) <= {"cancelled after its first answer", "cancelled with no answer yet",
                            "dropped after its first answer", "dropped with no answer yet",
                            "not sent (flood time over)"}, streams
    assert result["services"]["grpc_port_served_by"], "the report names what serves the public gRPC port"
    # Asserted: the classification of a BYTES output refused on every way in (the process lives on: ASSERTED), and
    # every damaged stream ended with a status, each followed by a valid request that was scored.
    classification = result["floods"]["bytes_classification"]
    assert classification["hostile"]["sent"] == classification["hostile"]["as_expected"] > 0, classification
    damaged = result["floods"]["damaged_streams"]
    assert damaged["unanswered"] == 0 and damaged["valid"]["sent"] == damaged["valid"]["as_expected"] > 0, damaged
    # The greedy client opened every call; the server may hold them or end them (a call whose message never comes
    # may be cut), as long as the second client is answered (ASSERTED).
    greedy = result["floods"]["greedy_client"]
    assert sum(greedy["held"]["ended"].values()) == greedy["held"]["calls"] + greedy["held"]["silent_streams"], greedy
    assert not any("failed" in outcome for outcome in greedy["held"]["ended"]), greedy
    # Asserted: same server and stubs throughout, and after shutdown no process of the run and no stub's
    # shared-memory region left.
    assert result["processes"]["before"] == [] and result["processes"]["after"] == []
    assert result["shm"]["regions_of_the_run"], "the stubs' regions were never seen"
    for name in ASSERTED:
        assert verdicts[name]["holds"] is True, (name, verdicts[name])
    assert "s2t_server_restarts_total 0" in result["supervisor"]

    # The services' output is kept beside the report, for what the verdicts point at.
    assert "ready: HTTP" in report.with_suffix(".serve.log").read_text()
    assert "ready: legacy Skill service" in report.with_suffix(".gateway.log").read_text()

    # The printed table and the exit code say the same as the report.
    assert "verdicts:" in done.stdout and all(name in done.stdout for name in verdicts)
    every = all(v["holds"] is True for v in verdicts.values())
    assert done.returncode == (0 if every else GATE_REFUSED), done.stdout + done.stderr[-3000:]
