"""`s2t bench --mode cpu-cost-smoke` against real servers: two sides (this tree's code, and a config knob) take turns
and each round's CPU per request is read from the server's process tree; no timed assertions."""
import json
import shutil
import subprocess

import pytest

from tests.conftest import DATA_CSV, MODEL_REPOSITORY, ROOT, S2T


@pytest.fixture(scope="module")
def cost_run(built_artifacts, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_cost")
    sides = ["--side", "base", "--side", "two:instances=2"]
    if shutil.which("h2load"):
        sides += ["--side", "grpc:client=h2load", "--side", "direct:front=off,client=h2load",
                  "--side", "process:front=process,client=h2load"]
    proc = subprocess.run([str(S2T), "bench", "--mode", "cpu-cost-smoke", *sides, "--repository",
                           str(MODEL_REPOSITORY), "--data", str(DATA_CSV), "--out", str(out), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    document = json.loads(proc.stdout)
    folder = out / "cpu_cost_smoke"
    assert document["mode"] == "cpu-cost-smoke" and document["results"] == str(folder / "results.md")
    return json.loads((folder / "results.json").read_text()), (folder / "results.md").read_text()


def test_every_side_is_measured_in_every_round_with_its_cpu_per_request(cost_run):
    results, _ = cost_run
    assert set(results["measured"]) >= {"base", "two"}
    for side, rounds in results["measured"].items():
        assert len(rounds) == 2, side
        for entry in rounds:
            assert entry["requests"] > 0 and entry["errors"] == 0, (side, entry)
            assert entry["server_cpu_us_per_request"] > 0 and entry["mean_batch"] >= 1, (side, entry)
            assert entry["server_cpu_us_per_request"] == pytest.approx(
                entry["front_end_cpu_us_per_request"] + entry["grpc_front_cpu_us_per_request"]
                + entry["stubs_cpu_us_per_request"], abs=0.3)
    assert results["relative_server_cpu_per_request"]["base"] == 1.0
    assert results["sides"]["two"]["server"] == {"instances": "2"}
    if "direct" in results["measured"]:
        # The front as a process costs CPU of its own; inside tritonserver its CPU is tritonserver's, and on Triton's
        # own endpoint there is no front at all.
        assert all(entry["grpc_front_cpu_us_per_request"] > 0 for entry in results["measured"]["process"])
        for side in ("grpc", "direct"):
            assert all(entry["grpc_front_cpu_us_per_request"] == 0 for entry in results["measured"][side])
        assert results["sides"]["direct"]["server"] == {"front": "off"}
        assert results["sides"]["process"]["server"] == {"front": "process"}


def test_the_report_names_each_side_and_says_whether_the_machine_was_quiet(cost_run):
    results, text = cost_run
    assert all(f"| {side} |" in text for side in results["measured"])
    assert ("busy machine" in text) != results["load"]["publishable"]


def test_the_protocol_comparison_can_use_the_low_cpu_generators_and_names_them(triton, tmp_path):
    """wrk on HTTP and h2load on gRPC against the session server: one short round each, counted by Triton."""
    if not (shutil.which("wrk") and shutil.which("h2load")):
        pytest.skip("wrk and h2load (Debian wrk, nghttp2-client) are installed by `make test`")
    from s2t.bench.load import h2load, perf_analyzer, wrk
    from s2t.bench.scenarios import protocols
    from s2t.bench.harness import report, workload
    from s2t.bench.harness.runner import TRITON_ROUTE, _stats
    from s2t.wire.names import PAYLOAD, PIPELINE

    payloads = workload.Workload.load(DATA_CSV).payloads()[:50]
    body = tmp_path / "grpc_body.bin"
    body.write_bytes(h2load.infer_body(PIPELINE, PAYLOAD, payloads[0]))
    load = protocols.Load(tmp_path / "unused.json", perf_analyzer.Settings(100),
                          wrk.write_script(tmp_path / "triton.lua", TRITON_ROUTE,
                                           [workload.triton_json_body(p) for p in payloads]), body, seconds=1)
    found = protocols.compare(triton.process.pid, {"http": triton.http_url, "grpc": triton.grpc_url}, PIPELINE, load,
                              4, 1, lambda: _stats(triton.http_url, PIPELINE)[0], log=lambda line: None,
                              clients="low-cpu")
    assert found["generators"] == {"http": "wrk", "grpc": "h2load"}
    for protocol in protocols.PROTOCOLS:
        (entry,) = found["rounds"][protocol]
        assert entry["requests"] > 1 and entry["requests_per_s"] > 0, (protocol, entry)
        # risk_pipeline runs in the server process: the server's own CPU is the work's.
        assert entry["client_cpu_us_per_request"] > 0 and entry["server_cpu_us_per_request"] > 0, (protocol, entry)
    assert found["grpc_vs_http"] > 0
    assert report.protocol_clients(found) == "HTTP: wrk, gRPC: h2load"
