"""`s2t bench` in smoke mode against the real server, and the locust users; no timed assertions."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA_CSV, ENSEMBLES, MODEL_REPOSITORY, ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke_run(built_artifacts, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([str(Path(sys.executable).parent / "s2t"), "bench", "--mode", "smoke", "--out", str(out),
                           "--repository", str(MODEL_REPOSITORY), "--repository", str(ENSEMBLES),
                           "--data", str(DATA_CSV), "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, json.loads((out / "results.json").read_text()), proc


def test_bench_measures_triton_over_both_protocols_and_both_baselines(smoke_run):
    _, results, _ = smoke_run
    points = results["perf_analyzer"]
    assert {(p["model"], p["protocol"]) for p in points} >= {
        ("risk_pipeline", "http"), ("risk_pipeline", "grpc"), ("risk_scorer", "http"), ("risk_scorer", "grpc")}
    assert any(p["request_rate"] for p in points) and any(p["batch"] > 1 for p in points)
    assert all(p["infer_per_s"] > 0 and p["p99_ms"] >= p["p50_ms"] > 0 for p in points)
    sides = [results["http_triton"], *results["http_fastapi_apps"].values()]
    assert set(results["http_fastapi_apps"]) == {"baseline", "fastapi-docs"}
    for side in sides:
        assert side["requests"] > 0 and side["errors"] == 0 and side["cpu_ms_per_request"] > 0
        # wrk's own CPU, the same generator on every side: on shared cores it is taken from the server.
        assert side["client_cpu_ms_per_request"] > 0 and side["answered"] == side["requests"]
    # The baseline is the stronger of the two FastAPI apps.
    assert results["http_baseline"]["throughput"] == max(e["throughput"] for e in results["http_fastapi_apps"].values())
    assert {p["what"] for p in results["inprocess"]} == {"onnxruntime", "decode+onnxruntime+decide"}
    # The ceiling (risk_pipeline's serving path, no work) took its turn in every round, on the same server.
    ceiling = results["ceiling"]
    assert len(ceiling["rounds"]) == len(results["http_rounds"]["triton"]) == len(ceiling["share"])
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in ceiling["rounds"]) and all(s > 0 for s in ceiling["share"])
    assert ceiling["triton_statistics"]["executions"] > 0 and "ceiling" not in results["http_rounds"]


def test_bench_compares_http_and_grpc_in_turns_with_the_cpu_each_side_spends(smoke_run):
    out, results, _ = smoke_run
    found = results["protocols"]
    assert found["model"] == "risk_pipeline" and found["concurrency"] == results["http_triton"]["connections"]
    assert found["generators"] == {"http": "wrk", "grpc": "h2load"}
    for protocol in ("http", "grpc"):
        for entry in found["rounds"][protocol]:
            assert entry["requests_per_s"] > 0 and entry["requests"] > 0
            # wrk's and h2load's own counts are not answers (non-2xx, gRPC errors in the trailers): Triton's are.
            assert entry["generator_requests_per_s"] > 0 and entry["requests_per_s"] == pytest.approx(
                entry["requests"] / entry["seconds"])
            # risk_pipeline runs in the server process: its work is tritonserver's own CPU (the stubs of the other
            # models may use none in a round).
            assert entry["client_cpu_us_per_request"] > 0 and entry["front_end_cpu_us_per_request"] > 0
            assert entry["server_cpu_us_per_request"] == pytest.approx(
                entry["front_end_cpu_us_per_request"] + entry["grpc_front_cpu_us_per_request"]
                + entry["stubs_cpu_us_per_request"], abs=0.3)
        # The gRPC front runs inside tritonserver: its CPU is tritonserver's own, no other process's.
        assert all(entry["grpc_front_cpu_us_per_request"] == 0 for entry in found["rounds"]["grpc"])
    assert results["ratios"]["grpc_vs_http_pipeline"] == pytest.approx(found["grpc_vs_http"])
    assert "### HTTP and gRPC, risk_pipeline" in (out / "results.md").read_text()


def test_bench_measures_latency_at_the_same_offered_rate_on_both_sides(smoke_run):
    """Triton and the plain FastAPI app at its strongest worker count, fed the same open-loop schedule at 50% and
    80% of that app's capacity (its median wrk round), each latency from the request's scheduled send."""
    out, results, _ = smoke_run
    found = results["open_loop"]
    opponent = found["opponent"]
    assert opponent in results["http_fastapi_apps"] and opponent.startswith("baseline")
    assert found["capacity_rps"] == results["http_fastapi_apps"][opponent]["throughput"] > 0
    assert [point["share"] for point in found["points"]] == [0.5, 0.8]
    for point in found["points"]:
        assert point["offered_rate"] == pytest.approx(point["share"] * found["capacity_rps"])
        assert set(point["rounds"]) == {"triton", opponent}
        for side, entries in point["rounds"].items():
            for entry in entries:
                # The same schedule on both sides: the same rate over the same time.
                assert entry["offered_rate"] == pytest.approx(point["offered_rate"])
                assert entry["scheduled"] == max(1, round(point["offered_rate"] * found["seconds"])), side
                assert entry["answered"] + entry["errors"] + entry["unanswered"] == entry["scheduled"], side
                assert entry["answered"] > 0 and 0 < entry["p50_ms"] <= entry["p99_ms"] <= entry["max_ms"], side
                assert entry["cpu_ms_per_request"] > 0 and isinstance(entry["kept_up"], bool), side
    shares = [t for t in results["targets"] if "open-loop schedule" in t["target"]]
    assert [t["target"].split(" of the capacity")[0][-3:] for t in shares] == ["50%", "80%"]
    markdown = (out / "results.md").read_text()
    assert "## Latency at the same offered rate (open loop" in markdown and "generator CPU ms/req" in markdown


def test_both_fastapi_apps_give_the_same_answers_as_risk_pipeline(smoke_run):
    _, results, _ = smoke_run
    assert set(results["same_answers"]) == {"baseline", "fastapi-docs"}
    for compared in results["same_answers"].values():
        assert compared["same_decisions"] is True and compared["max_abs_diff"] < 1e-5


def test_bench_shows_where_risk_pipeline_spends_its_time(smoke_run):
    out, results, _ = smoke_run
    found = results["where_time_goes"]
    statistics = found["triton_statistics"]
    assert statistics["requests"] > 0 and statistics["mean_batch"] >= 1
    assert all(v > 0 for v in statistics["per_execution_us"].values())
    spy = found["py_spy"]
    assert spy["samples"] > 0 and any(e["frame"] == "InProcessModel.execute (model.py)" for e in spy["inclusive"])
    assert "## Where risk_pipeline's time goes" in (out / "results.md").read_text()


def test_bench_measures_cold_start_memory_hot_swap_and_streaming(smoke_run):
    _, results, _ = smoke_run
    assert results["cold_start"]["median_s"] > 0 and "risk_pipeline:1" in results["cold_start"]["models"]
    memory = results["memory"]
    assert memory["triton_peak_bytes"] >= memory["triton_idle_bytes"] > 0
    assert any("skill_adapter" in name for name in memory["triton_after_load_by_process"])
    swap = results["hot_swap"]
    # `s2t rollback` under gRPC load: every rolled-back version gave way to the previous one, no request failed.
    assert swap["swaps"] and swap["errors"] == 0 and swap["answered"] > 0
    assert (swap["model_control_mode"], swap["admin_key"], swap["callers"]) == ("explicit", True, 4)
    assert all(s["in_force_s"] is not None and s["rollback_s"] > 0 for s in swap["swaps"])
    assert results["streaming"]["records"] > 0 and results["streaming"]["exactly_once"] is True


def test_ratios_are_computed_from_the_measured_numbers(smoke_run):
    _, results, _ = smoke_run
    ratios, triton, base = results["ratios"], results["http_triton"], results["http_baseline"]
    assert ratios["http_throughput_vs_fastapi"] == pytest.approx(triton["throughput"] / base["throughput"])
    assert ratios["http_p99_triton_over_fastapi_p50"] == pytest.approx(triton["p99_ms"] / base["p50_ms"])
    batch = ratios["batch"]
    scorer = next(p for p in results["perf_analyzer"]
                  if p["model"] == "risk_scorer" and p["protocol"] == "grpc" and p["batch"] == batch)
    engine = next(p for p in results["inprocess"] if p["what"] == "onnxruntime" and p["batch"] == batch)
    assert ratios["grpc_scorer_batch_vs_inprocess"] == pytest.approx(scorer["infer_per_s"] / engine["rows_per_s"])
    # HTTP ratio, p99, CPU per request, gRPC against HTTP (the alternating rounds run in every mode), batches, cold
    # start, RSS.
    # and p99 at the same offered rate at each share of the plain FastAPI app's capacity.
    assert len(results["targets"]) == 7 + len(results["open_loop"]["points"])
    assert all(isinstance(t["met"], bool) for t in results["targets"])


def test_bench_times_cold_start_from_s2t_serve_and_weighs_the_whole_serving_tree(smoke_run):
    """The clock a user sees (`s2t serve`'s launch to every model ready), and the RSS of what serves after load:
    s2t serve itself, tritonserver and every stub."""
    out, results, _ = smoke_run
    cold = results["cold_start"]
    assert cold["clock"] == "s2t serve's launch to every model ready" and len(cold["seconds"]) == 1
    assert cold["median_s"] > 0 and cold["tritonserver_start_s"] > 0 and cold["first_s"] == cold["seconds"][0]
    tree = results["serving_tree"]
    names = list(tree["after_load_by_process"])
    assert any(n.startswith("s2t (") for n in names) and any(n.startswith("tritonserver (") for n in names), names
    assert any("skill_adapter" in n for n in names) and tree["after_load_bytes"] == sum(
        tree["after_load_by_process"].values())
    (rss,) = [t for t in results["targets"] if t["target"].startswith("RSS of the serving tree (s2t serve")]
    assert rss["measured"].startswith(f"{tree['after_load_bytes'] / 2**20:.0f} MB")
    assert any(t["target"].endswith("from s2t serve's launch") for t in results["targets"])
    assert "RSS of the serving tree (s2t serve, tritonserver, stubs), after load" in (out / "results.md").read_text()


def test_bench_records_the_machine_load_of_every_round_and_whether_the_run_is_publishable(smoke_run):
    out, results, _ = smoke_run
    load = results["load"]
    found, rounds = results["protocols"], len(results["http_triton"]["rounds_throughput"])
    measured = {f"wrk {side} round {n}" for n in range(1, rounds + 1)
                for side in ("triton", *results["http_fastapi_apps"], "ceiling")}
    measured |= {f"{found['generators'][protocol]} {found['model']} {protocol} c={found['concurrency']} round {n}"
                 for protocol, entries in found["rounds"].items() for n in range(1, len(entries) + 1)}
    open_loop = results["open_loop"]
    measured |= {f"open-loop {side} at {point['share']:.0%} round {n}" for point in open_loop["points"]
                 for side, entries in point["rounds"].items() for n in range(1, len(entries) + 1)}
    labels = [r["label"] for r in load["rounds"]]
    assert set(measured) <= set(labels)
    assert len(labels) == len(measured) + len(results["perf_analyzer"]) + len(results["perf_analyzer_failures"])
    assert all(r["wall_seconds"] > 0 and 0 <= r["other_cpu_share"] <= 1 for r in load["rounds"])
    assert load["cores"] == results["machine"]["logical_cores"]
    assert load["load_average_1m_at_start"] == results["machine"]["load_average_at_start"][0]
    busy = (load["load_average_1m_at_start"] / load["cores"] > 0.25
            or any(r["other_cpu_share"] > 0.10 for r in load["rounds"]))
    assert results["publishable"] is load["publishable"] is (not busy) and bool(load["reasons"]) is busy
    markdown = (out / "results.md").read_text()
    assert ("**NOT PUBLISHABLE: taken on a busy machine.**" in markdown) is busy
    assert ("**Publishable**" in markdown) is not busy


def test_bench_writes_markdown_tables_and_non_empty_plots(smoke_run):
    out, results, proc = smoke_run
    markdown = (out / "results.md").read_text()
    assert "| server | req/s | rounds req/s | p50 ms | p90 ms | p99 ms | CPU ms/req |" in markdown
    assert "FastAPI fastapi-docs" in markdown
    assert "| target | measured | met |" in markdown and "| model | protocol | batch |" in markdown
    assert f"{results['http_triton']['throughput']:.0f}" in markdown
    assert results["plots"]
    for name in results["plots"]:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "results:" in proc.stderr and ("met" in proc.stderr or "MISSED" in proc.stderr)


def test_bench_json_is_the_results_document_with_where_the_tables_are(smoke_run):
    out, results, proc = smoke_run
    document = json.loads(proc.stdout)
    assert document == {**results, "results": str(out / "results.md")}


def test_bench_shows_its_steps_done_out_of_the_total_on_stderr_a_line_per_tenth_on_a_pipe(smoke_run):
    out, _, proc = smoke_run
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench smoke: ")]
    assert 2 <= len(progress) <= 11, progress
    first = re.fullmatch(r"bench smoke: cold start 1/1: 0/(\d+) steps \(0%\)", progress[0])
    assert first, progress[0]
    total = int(first.group(1))
    # The total is counted right: the whole is reached when the results are written, not before.
    assert progress[-1].startswith(f"bench smoke: results in {out}: {total}/{total} steps (100%) after ")
    assert sum(f": {total}/{total} steps" in line for line in progress) == 1


def test_locust_users_score_real_records_over_http_and_grpc_without_failures(triton):
    env = dict(os.environ, S2T_GRPC_URL=triton.grpc_url, S2T_DATA=str(DATA_CSV), S2T_MAX_REQUESTS="2000")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "locust"), "-f", str(ROOT / "s2t" / "bench" / "load" / "locustfile.py"), "--headless",
         "-u", "4", "-r", "4", "--run-time", "5s", "--host", f"http://{triton.http_url}", "--only-summary",
         "--json", "HttpRecordUser", "GrpcRecordUser"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "s2t-locust:" in output and "0 failures" in output and "PASS" in output
    # The final statistics, printed at exit (a --csv file is rewritten once a second and can miss a short run).
    summary = json.loads(proc.stdout[proc.stdout.index("["):proc.stdout.rindex("]") + 1])
    requests = {entry["name"]: entry["num_requests"] for entry in summary}
    assert requests.get("http risk_pipeline", 0) > 0 and requests.get("grpc risk_pipeline", 0) > 0, requests
