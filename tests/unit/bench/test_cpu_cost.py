"""s2t/bench/scenarios/cpu_cost.py's pure parts: the sides as written on the command line, the config a side serves, the
code of another revision, and the arithmetic of CPU per request and of paired ratios."""
import sys
from pathlib import Path

import pytest

from s2t import triton_config
from s2t.backends.runtime import bytes_tensor
from s2t.bench.harness import process_tree
from s2t.bench.scenarios import cpu_cost
from s2t.bench.load import h2load
from s2t.serve.triton_server import LATENCY_SUMMARY_ARGS

ROOT = Path(__file__).resolve().parents[3]
PIPELINE_CONFIG = (ROOT / "model_repository" / "risk_pipeline" / "config.pbtxt").read_text()


@pytest.mark.parametrize("text, side", [
    ("base", cpu_cost.Side("base")),
    ("two:instances=2", cpu_cost.Side("two", (("instances", "2"),))),
    ("g:client=perf_analyzer,protocol=grpc", cpu_cost.Side("g", (), "perf_analyzer", "grpc")),
    ("h:client=h2load", cpu_cost.Side("h", (), "h2load", "grpc")),
    ("old:rev=HEAD~1,queue_delay_us=0", cpu_cost.Side("old", (("queue_delay_us", "0"), ("rev", "HEAD~1")))),
    ("direct:front=off,client=perf_analyzer,protocol=grpc",
     cpu_cost.Side("direct", (("front", "off"),), "perf_analyzer", "grpc")),
    ("tritons-own:http_front=off", cpu_cost.Side("tritons-own", (("http_front", "off"),), "wrk", "http")),
])
def test_a_side_is_a_name_with_server_and_client_knobs(text, side):
    assert cpu_cost.parse_side(text) == side


@pytest.mark.parametrize("text, message", [
    (":instances=2", "no name"),
    ("a:instances", "is not knob=value"),
    ("a:threads=2", "unknown knob 'threads'"),
    ("a:client=ab", "client must be one of"),
    ("a:protocol=grpc", "wrk speaks http here, not 'grpc'"),
    ("a:client=perf_analyzer,protocol=udp", "perf_analyzer speaks http or grpc here, not 'udp'"),
    ("a:client=h2load,protocol=http", "h2load speaks grpc here"),
    ("a:front=no", "front is on, off, process, got 'no'"),
    ("a:http_front=process", "http_front is on, off, got 'process'"),
    ("a:summaries=yes", "summaries is off, on, triton or quantiles"),
    ("a:summaries=0.99", "summaries is off, on, triton or quantiles"),
])
def test_a_side_that_cannot_be_measured_is_refused_naming_the_knob(text, message):
    with pytest.raises(ValueError, match=message):
        cpu_cost.parse_side(text)


def test_no_side_named_measures_the_default_pair_and_a_name_given_twice_is_refused():
    assert [s.name for s in cpu_cost.parse_sides(())] == [cpu_cost.parse_side(t).name for t in cpu_cost.DEFAULT_SIDES]
    assert len(cpu_cost.parse_sides(())) == 2
    with pytest.raises(ValueError, match="side names must differ"):
        cpu_cost.parse_sides(["a", "a:instances=2"])


def test_s2t_bench_refuses_a_side_it_cannot_measure_naming_the_knob_before_starting_a_server(tmp_path,
                                                                                           built_artifacts):
    from click.testing import CliRunner

    from s2t.cli import main
    result = CliRunner().invoke(main, ["bench", "--mode", "cpu-cost-smoke", "--side", "a:threads=2",
                                       "--data", str(built_artifacts["data"]), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "--side: side a: unknown knob 'threads'" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_sides_with_the_same_server_knobs_share_one_server():
    http, grpc = cpu_cost.parse_side("h"), cpu_cost.parse_side("g:client=perf_analyzer,protocol=grpc")
    assert http.server_key == grpc.server_key != cpu_cost.parse_side("two:instances=2").server_key


def test_a_sides_knobs_change_only_what_they_name_in_the_pipelines_config():
    before = triton_config.load_text(PIPELINE_CONFIG)
    after = triton_config.load_text(cpu_cost.edit_config(PIPELINE_CONFIG, {
        "instances": "2", "queue_delay_us": "500", "preferred": "8/16", "intra_op_threads": "2"}))
    assert [g.count for g in after.instance_group] == [2]
    assert after.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(after.dynamic_batching.preferred_batch_size) == [8, 16]
    assert after.parameters["intra_op_thread_count"].string_value == "2"
    for group in after.instance_group:
        group.count = before.instance_group[0].count
    after.dynamic_batching.CopyFrom(before.dynamic_batching)
    after.parameters["intra_op_thread_count"].string_value = before.parameters["intra_op_thread_count"].string_value
    assert after == before


def test_no_knob_serves_the_config_as_it_is():
    assert triton_config.load_text(cpu_cost.edit_config(PIPELINE_CONFIG, {})) == triton_config.load_text(PIPELINE_CONFIG)


def test_http_threads_become_tritonservers_option():
    assert cpu_cost.server_args({"http_threads": "4"}) == ["--http-thread-count=4"]
    assert cpu_cost.server_args({"instances": "2"}) == []


@pytest.mark.parametrize("value, args", [
    ("off", []),
    ("on", LATENCY_SUMMARY_ARGS),
    ("triton", ["--metrics-config=summary_latencies=true"]),
    ("0.5:0.05/0.99:0.001", ["--metrics-config=summary_latencies=true",
                             "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001"]),
])
def test_the_summaries_knob_measures_tritons_latency_summaries_as_served_or_as_given(value, args):
    assert cpu_cost.server_args({"summaries": value}) == args
    assert cpu_cost.parse_side(f"s:summaries={value}").server == (("summaries", value),)


def test_another_revisions_code_is_imported_though_this_checkouts_package_already_is(tmp_path):
    # As in the in-process backend's interpreter: this checkout's `s2t` is imported before the model.py runs.
    import s2t.backends.records.record_decoder  # noqa: F401
    (tmp_path / "s2t" / "backends" / "records").mkdir(parents=True)
    for package in ("s2t", "s2t/backends", "s2t/backends/records"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "s2t" / "backends" / "records" / "record_decoder.py").write_text("WHERE = 'revision'\n")
    source = cpu_cost.with_source_root("from s2t.backends.records.record_decoder import WHERE\n", tmp_path)
    assert _run_model_py(source)["WHERE"] == "revision"


def _run_model_py(source: str) -> dict:
    namespace: dict = {}
    saved_path, saved_modules, saved_finders = list(sys.path), dict(sys.modules), list(sys.meta_path)
    try:
        exec(compile(source, "model.py", "exec"), namespace)
    finally:
        sys.path[:] = saved_path
        sys.meta_path[:] = saved_finders
        sys.modules.clear()
        sys.modules.update(saved_modules)
    return namespace


def test_a_revision_with_top_level_backends_is_imported_through_its_own_finder(tmp_path):
    """A revision laid out as this checkout is (backends/ beside s2t/, mapped by s2t/__init__.py): its
    s2t.backends is its own backends/, not this checkout's."""
    import s2t
    import s2t.backends.records.record_decoder
    (tmp_path / "s2t").mkdir()
    (tmp_path / "s2t" / "__init__.py").write_text(Path(s2t.__file__).read_text())
    (tmp_path / "setup.py").write_text("")
    for package in ("backends", "clients", "backends/records"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "backends" / "records" / "record_decoder.py").write_text("WHERE = 'revision'\n")
    source = cpu_cost.with_source_root("from s2t.backends.records.record_decoder import WHERE\n", tmp_path)
    assert _run_model_py(source)["WHERE"] == "revision"


def test_a_revisions_code_carries_the_generated_wire_format_which_git_does_not_hold(tmp_path):
    tree = cpu_cost._revision_tree("HEAD", tmp_path / "rev")
    assert (tree / "s2t" / "backends" / "records" / "record_decoder.py").is_file()
    assert (tree / "s2t" / "wire" / "skill_pb2.py").is_file() and (tree / "s2t" / "wire" / "tf_example_pb2.py").is_file()


def test_cpu_per_request_splits_the_server_into_tritonserver_the_grpc_front_and_stubs():
    figures = process_tree.per_request({"tree": 0.3, "own": 0.1, "grpc_front": 0.04, "client": 0.05}, 2000)
    assert figures == {"server_cpu_us_per_request": 170.0, "front_end_cpu_us_per_request": 50.0,
                       "grpc_front_cpu_us_per_request": 20.0, "stubs_cpu_us_per_request": 100.0,
                       "client_cpu_us_per_request": 25.0}


def test_a_round_that_answered_nothing_divides_by_one_not_zero():
    figures = process_tree.per_request({"tree": 0.001, "own": 0.0, "grpc_front": 0.0, "client": 0.0}, 0)
    assert figures["server_cpu_us_per_request"] == 1000.0


def test_relative_figures_are_the_median_of_each_rounds_ratio():
    # The machine doubles everyone's cost in round 2: ratios within a round still say "b costs 0.9x of a".
    measured = {"a": [{"cost": 100.0}, {"cost": 200.0}, {"cost": 110.0}],
                "b": [{"cost": 90.0}, {"cost": 180.0}, {"cost": 110.0}]}
    assert cpu_cost.relative(measured, "cost") == {"a": 1.0, "b": 0.9}


def test_a_sides_figure_is_its_median_round_by_server_cpu_kept_whole():
    rounds = [{"server_cpu_us_per_request": 100.0, "requests_per_s": 900.0},
              {"server_cpu_us_per_request": 140.0, "requests_per_s": 600.0},
              {"server_cpu_us_per_request": 120.0, "requests_per_s": 1000.0}]
    assert cpu_cost.median_round(rounds, "server_cpu_us_per_request", higher_is_better=False) == {
        "server_cpu_us_per_request": 120.0, "requests_per_s": 1000.0, "round": 3}


H2LOAD_OUTPUT = """starting benchmark...
finished in 3.00s, 7074.10 req/s, 1.02MB/s
requests: 21222 total, 21238 started, 21222 done, 21200 succeeded, 20 failed, 2 errored, 0 timeout
status codes: 21200 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 3.07MB (3215456) total, 0B (0) headers (space savings 0.00%), 1.99MB (2081756) data
                     min         max         mean         sd        +/- sd
time for request:      426us     24.70ms      2.24ms      1.55ms    83.31%
"""


def test_h2loads_summary_gives_answers_seconds_failures_and_mean_latency():
    found = h2load.parse(H2LOAD_OUTPUT)
    assert (found.requests, found.seconds, found.failed, found.mean_ms) == (21200, 3.0, 22, 2.24)
    assert found.throughput == pytest.approx(21200 / 3.0)


def test_h2load_without_a_summary_is_an_error():
    with pytest.raises(RuntimeError, match="no result"):
        h2load.parse("connect failed\n")


def test_the_grpc_body_is_one_framed_model_infer_request_of_the_record():
    from tritonclient.grpc import service_pb2

    body = h2load.infer_body("risk_pipeline", "payload", b'{"features": {}}')
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    request = service_pb2.ModelInferRequest.FromString(body[5:])
    assert (request.model_name, request.inputs[0].name, request.inputs[0].datatype) == ("risk_pipeline", "payload",
                                                                                         "BYTES")
    assert list(request.inputs[0].shape) == [1, 1]
    assert bytes_tensor.decode(request.raw_input_contents[0]) == [b'{"features": {}}']


def test_a_revision_side_serves_that_revisions_risk_pipeline_config_and_model(tmp_path):
    import subprocess

    from tests.conftest import ROOT
    # The revision that added the in-process backend, and the one before it (risk_pipeline on the python backend).
    before = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--",
                             "native/python_inprocess.cc"], capture_output=True, text=True, check=True).stdout.split()
    before = before[-1] if before else ""
    if not before:
        pytest.skip("no git history here")
    cpu_cost._revision_model(f"{before}~1", tmp_path)
    assert 'backend: "python"' in (tmp_path / "config.pbtxt").read_text()
    assert "TritonPythonModel" in (tmp_path / "1" / "model.py").read_text()
    cpu_cost._revision_model(before, tmp_path)
    assert 'backend: "s2t_inprocess"' in (tmp_path / "config.pbtxt").read_text()
    assert "InProcessModel" in (tmp_path / "1" / "model.py").read_text()
