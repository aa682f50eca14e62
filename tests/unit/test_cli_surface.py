import os
import re
import shutil
import socket
import subprocess
import urllib.error
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, ROOT, S2T
from s2t import exit_codes
from s2t.cli import main
from s2t.serve.triton_server import free_port



def s2t(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(S2T), *args], cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=timeout)


def test_version_prints_one_line_with_the_version_number():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"s2t \d+\.\d+\.\d+\n", result.output)


def test_make_refuses_an_unsupported_python_with_a_clear_message(tmp_path):
    result = subprocess.run(["make", "-s", "venv", "PYTHON=", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs Python 3.11 or 3.12" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_exit_codes_are_distinct_and_each_documented_in_docs_cli():
    codes = [exit_codes.OK, exit_codes.FAILED, exit_codes.USAGE, exit_codes.GATE_REFUSED, exit_codes.UNREACHABLE,
             exit_codes.REJECTED]
    assert len(set(codes)) == len(codes) and set(codes) == set(exit_codes.MEANINGS)
    doc = (ROOT / "docs" / "cli.md").read_text()
    for code, meaning in exit_codes.MEANINGS.items():
        assert f"| {code} | {meaning} |" in doc


@pytest.mark.parametrize("args", [
    ["publish"],
    ["canary", "risk_scorer", "--percent", "10", "--off"],
    ["status", "--no-such-option"],
    ["parity", "--saved-model", "no/such/dir", "--onnx", "x.onnx", "--data", "x.csv"],
], ids=["missing-arguments", "excluding-options", "unknown-option", "missing-path"])
def test_a_usage_error_exits_with_the_usage_code(args):
    done = s2t(*args)
    assert done.returncode == exit_codes.USAGE, done.stderr
    assert "Usage:" in done.stderr or "Error:" in done.stderr


def _unreachable_commands(repository: Path, url: str) -> list[list[str]]:
    grpc = url
    return [
        ["status", "--http-url", url, "--repository", str(repository)],
        ["publish", "risk_scorer", "artifacts/onnx/risk_scorer.onnx", "--repository", str(repository),
         "--http-url", url],
        ["promote", "risk_scorer", "2", "--repository", str(repository), "--http-url", url],
        ["rollback", "risk_scorer", "--yes", "--repository", str(repository), "--http-url", url],
        ["canary", "risk_scorer", "2", "--percent", "10", "--repository", str(repository), "--http-url", url],
        ["canary", "risk_scorer", "2", "--auto", "--repository", str(repository), "--http-url", url],
        ["drift", "--http-url", url],
        ["stream", "--grpc-url", grpc, "--records", "10"],
    ]


def test_every_command_that_talks_to_a_server_exits_unreachable_and_changes_nothing_when_none_listens(tmp_path):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repository)
    shutil.copytree(ENSEMBLES, tmp_path / "ensembles")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    url = f"localhost:{free_port()}"  # nothing listens there
    for args in _unreachable_commands(repository, url):
        done = s2t(*args)
        assert done.returncode == exit_codes.UNREACHABLE, (args, done.stderr)
        assert "unreachable" in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_check_config_problems_exit_with_the_gate_refused_code(tmp_path):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY / "risk_decision", repository / "risk_decision")
    config = repository / "risk_decision" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "risk_decision"', 'name: "not_risk_decision"'))
    done = s2t("check-config", "--repository", str(repository))
    assert done.returncode == exit_codes.GATE_REFUSED, done.stdout + done.stderr
    assert "not_risk_decision" in done.stderr


def test_a_failed_command_exits_with_the_failure_code_and_no_traceback(tmp_path):
    done = s2t("rollback", "risk_scorer", "--yes", "--repository", str(tmp_path))
    assert done.returncode == exit_codes.FAILED, done.stderr
    assert done.stderr.startswith("Error:") and "Traceback" not in done.stderr


def _triton_error(status: str, message: str):
    from tritonclient.utils import InferenceServerException
    return InferenceServerException(message, status=status)


@pytest.mark.parametrize("err, unreachable", [
    (ConnectionRefusedError(111, "Connection refused"), True),
    (socket.gaierror(-2, "Name or service not known"), True),
    (urllib.error.URLError(ConnectionRefusedError(111, "refused")), True),
    (urllib.error.HTTPError("http://x/metrics", 404, "Not Found", {}, None), False),
    (_triton_error("StatusCode.UNAVAILABLE", "failed to connect to all addresses"), True),
    (_triton_error("StatusCode.UNAVAILABLE", "risk_scorer is not serving: circuit open"), False),
    (_triton_error("400", "features.duration_in_month: missing"), False),
    (FileNotFoundError(2, "No such file"), False),
], ids=["refused", "unknown-host", "urlopen-refused", "http-404", "grpc-no-connection", "grpc-model-unavailable",
        "invalid-record", "missing-file"])
def test_only_errors_where_nothing_answered_count_as_unreachable(err, unreachable):
    assert exit_codes.is_unreachable(err) is unreachable


def _commands(group: click.Group = main, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from _commands(command, prefix + (name,))


def _shown_names(command: click.Command) -> set[str]:
    ctx = click.Context(command)
    return {name for param in command.params if isinstance(param, click.Option) and not param.hidden
            for name in param.get_help_record(ctx)[0].replace(",", " ").split() if name.startswith("--")}


def test_server_addresses_and_repositories_have_one_spelling_in_every_help():
    shown = set().union(*(_shown_names(command) for _, command in _commands()))
    assert not shown & {"--url", "--triton-url", "--model-repository", "--url-precision", "--protocol"}
    assert {"--http-url", "--grpc-url", "--repository"} <= shown
    for path, command in _commands():
        for name in _shown_names(command):
            if name.endswith("-url"):
                assert name in {"--http-url", "--grpc-url", "--metrics-url"}, (path, name)


@pytest.mark.parametrize("spelling", [["--http-url", "{url}"], ["--url", "{url}"], []], ids=["new", "old", "env"])
def test_old_spellings_and_the_environment_still_reach_the_same_option(spelling):
    url = f"localhost:{free_port()}"
    env = {"S2T_HTTP_URL": url} if not spelling else {}
    done = subprocess.run([str(S2T), "status", *[s.format(url=url) for s in spelling]], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == exit_codes.UNREACHABLE and url in done.stderr, done.stderr


def test_parity_refuses_two_servers_at_once(tmp_path):
    # The paths only have to exist: the two servers are refused before anything is read.
    (tmp_path / "saved_model").mkdir()
    for name in ("scorer.onnx", "data.csv"):
        (tmp_path / name).write_text("")
    done = s2t("parity", "--saved-model", str(tmp_path / "saved_model"), "--onnx", str(tmp_path / "scorer.onnx"),
               "--data", str(tmp_path / "data.csv"), "--http-url", "a:1", "--grpc-url", "b:2")
    assert done.returncode == exit_codes.USAGE and "--http-url or --grpc-url" in done.stderr


def test_every_command_has_a_docstring_and_every_option_and_argument_has_help():
    missing = []
    for path, command in _commands():
        name = " ".join(path)
        if not (command.help or "").strip():
            missing.append(f"{name}: no docstring")
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            if isinstance(param, click.Option) and not (param.help or "").strip():
                missing.append(f"{name} {param.opts[0]}: no help")
            if isinstance(param, click.Argument) and param.name.upper() not in (command.help or ""):
                missing.append(f"{name} {param.human_readable_name}: not described in the docstring")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("given, expected", [
    ((None, None, None, "http"), (None, "http")),
    (("h:1", None, None, "http"), ("h:1", "http")),
    ((None, "g:2", None, "http"), ("g:2", "grpc")),
    ((None, None, "o:3", "grpc"), ("o:3", "grpc")),
    ((None, None, "o:3", "http"), ("o:3", "http")),
], ids=["none", "http", "grpc", "old-url-grpc", "old-url-http"])
def test_server_address_reads_the_new_and_the_old_spellings(given, expected):
    from s2t.cli import server_address
    assert server_address(*given) == expected


def test_server_address_refuses_two_servers():
    from s2t.cli import server_address
    with pytest.raises(click.UsageError):
        server_address("h:1", None, "o:3", "grpc")
