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
from s2t import errors
from s2t.control import reachability
from s2t.cli import main
from s2t.serve.triton_server import free_port


def s2t(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(S2T), *args], cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=timeout)


@pytest.fixture
def s2t_here(monkeypatch):
    """The installed script's group run in this process (standalone, as the script runs it, from the project root),
    for checks of exit codes and messages that do not need an interpreter of their own. An error that escaped as a
    bug would be the result's exception instead of the SystemExit click ends with."""
    monkeypatch.chdir(ROOT)

    def run(*args: str, env: dict[str, str] | None = None):
        result = CliRunner().invoke(main, list(args), env=env)
        assert isinstance(result.exception, SystemExit), (args, result.exc_info)
        return result
    return run


def test_version_prints_one_line_with_the_version_number():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"s2t \d+\.\d+\.\d+\n", result.output)


def test_python_dash_m_s2t_cli_runs_the_same_command_line():
    """The GPU environment has no s2t script: `python -m s2t.cli` is how it runs the commands."""
    import sys
    done = subprocess.run([sys.executable, "-m", "s2t.cli", "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and re.fullmatch(r"s2t \d+\.\d+\.\d+\n", done.stdout), done.stderr


def test_make_refuses_an_unsupported_python_with_a_clear_message(tmp_path):
    result = subprocess.run(["make", "-s", "venv", "PYTHON=", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs Python 3.11 or 3.12" in result.stderr
    assert not (tmp_path / "venv").exists()


def test_exit_codes_are_distinct_and_each_documented_in_docs_cli():
    codes = [errors.OK, errors.FAILED, errors.USAGE, errors.GATE_REFUSED, errors.UNREACHABLE,
             errors.REJECTED]
    assert len(set(codes)) == len(codes) and set(codes) == set(errors.MEANINGS)
    doc = (ROOT / "docs" / "cli.md").read_text()
    for code, meaning in errors.MEANINGS.items():
        assert f"| {code} | {meaning} |" in doc


@pytest.mark.parametrize("args", [
    ["publish"],
    ["canary", "risk_scorer", "--percent", "10", "--off"],
    ["status", "--no-such-option"],
    ["parity", "--saved-model", "no/such/dir", "--onnx", "x.onnx", "--data", "x.csv"],
], ids=["missing-arguments", "excluding-options", "unknown-option", "missing-path"])
def test_a_usage_error_exits_with_the_usage_code(args, s2t_here):
    done = s2t_here(*args)
    assert done.exit_code == errors.USAGE, done.stderr
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


def test_every_command_that_talks_to_a_server_exits_unreachable_and_changes_nothing_when_none_listens(tmp_path,
                                                                                                      s2t_here):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repository)
    shutil.copytree(ENSEMBLES, tmp_path / "ensembles")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    url = f"localhost:{free_port()}"  # nothing listens there
    for args in _unreachable_commands(repository, url):
        done = s2t_here(*args)
        assert done.exit_code == errors.UNREACHABLE, (args, done.stderr)
        assert "unreachable" in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_check_config_problems_exit_with_the_gate_refused_code(tmp_path, s2t_here):
    repository = tmp_path / "model_repository"
    shutil.copytree(MODEL_REPOSITORY / "risk_decision", repository / "risk_decision")
    config = repository / "risk_decision" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "risk_decision"', 'name: "not_risk_decision"'))
    done = s2t_here("check-config", "--repository", str(repository))
    assert done.exit_code == errors.GATE_REFUSED, done.output
    assert "not_risk_decision" in done.stderr


def test_a_failed_command_exits_with_the_failure_code_and_no_traceback(tmp_path):
    done = s2t("rollback", "risk_scorer", "--yes", "--repository", str(tmp_path))
    assert done.returncode == errors.FAILED, done.stderr
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
    assert reachability.is_unreachable(err) is unreachable


def _commands(group: click.Group = main, prefix: tuple[str, ...] = ()):
    context = click.Context(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
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


# The older spellings the public contract (docs/cli.md) still names for these commands; every other option shows
# in its command's help.
CONTRACT_SPELLINGS = {("parity", "--url"), ("score", "--url"), ("score", "--protocol"), ("promote", "--url"),
                      ("status", "--url"), ("drift", "--url"), ("gateway", "--triton-url"),
                      ("serve", "--model-repository")}


def test_no_option_is_left_out_of_the_help_but_the_spellings_the_contract_names():
    left_out = set()
    for path, command in _commands():
        shown = _shown_names(command)
        for param in command.params:
            if isinstance(param, click.Option):
                left_out |= {(" ".join(path), name) for name in [*param.opts, *param.secondary_opts]
                             if name.startswith("--") and name not in shown}
    assert left_out == CONTRACT_SPELLINGS


@pytest.mark.parametrize("args", [
    ["rollback", "risk_scorer", "--yes", "--url", "localhost:1"],
    ["canary", "risk_scorer", "--off", "--url", "localhost:1"],
    ["publish", "risk_scorer", "x.onnx", "--url", "localhost:1"],
    ["stream", "--url", "localhost:1"],
    ["bench", "--url", "localhost:1"],
    ["check-config", "--model-repository", "model_repository"],
    ["parity", "--saved-model", ".", "--onnx", "x", "--data", "x", "--url-precision", "fp16"],
], ids=["rollback-url", "canary-url", "publish-url", "stream-url", "bench-url", "check-config-model-repository",
        "parity-url-precision"])
def test_spellings_no_contract_names_are_unknown_options(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == errors.USAGE and "No such option" in result.output, result.output


@pytest.mark.parametrize("spelling", [["--http-url", "{url}"], ["--url", "{url}"], []], ids=["new", "old", "env"])
def test_old_spellings_and_the_environment_still_reach_the_same_option(spelling, s2t_here, monkeypatch):
    url = f"localhost:{free_port()}"
    monkeypatch.delenv("S2T_HTTP_URL", raising=False)
    env = {"S2T_HTTP_URL": url} if not spelling else None
    done = s2t_here("status", *[s.format(url=url) for s in spelling], env=env)
    assert done.exit_code == errors.UNREACHABLE and url in done.stderr, done.stderr


def test_parity_refuses_two_servers_at_once(tmp_path, s2t_here):
    # The paths only have to exist: the two servers are refused before anything is read.
    (tmp_path / "saved_model").mkdir()
    for name in ("scorer.onnx", "data.csv"):
        (tmp_path / name).write_text("")
    done = s2t_here("parity", "--saved-model", str(tmp_path / "saved_model"), "--onnx", str(tmp_path / "scorer.onnx"),
                    "--data", str(tmp_path / "data.csv"), "--http-url", "a:1", "--grpc-url", "b:2")
    assert done.exit_code == errors.USAGE and "--http-url or --grpc-url" in done.stderr


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
    ((None, None), (None, "http")),
    (("h:1", None), ("h:1", "http")),
    ((None, "g:2"), ("g:2", "grpc")),
], ids=["none", "http", "grpc"])
def test_server_address_reads_one_of_the_two_urls(given, expected):
    from s2t.cli.options import server_address
    assert server_address(*given) == expected


def test_server_address_refuses_two_servers():
    from s2t.cli.options import server_address
    with pytest.raises(click.UsageError):
        server_address("h:1", "g:2")


def test_every_bench_mode_is_one_function_of_the_options_in_one_table():
    import inspect

    from s2t.bench.harness.registry import BENCH_MODES, BenchOptions
    mode_option = next(p for p in main.get_command(click.Context(main), "bench").params if p.name == "mode")
    assert list(mode_option.type.choices) == list(BENCH_MODES)
    for name, mode in BENCH_MODES.items():
        parameters = list(inspect.signature(mode.run).parameters.values())
        assert len(parameters) == 1 and parameters[0].annotation in (BenchOptions, "BenchOptions"), name
        assert mode.help and name in mode_option.help, name


def _every_s2t_error_class() -> list[type]:
    import importlib

    for path in sorted((ROOT / "s2t").rglob("*.py")):
        if "S2TError" in path.read_text() and path.parent.name != "cli":
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    found, todo = [], [errors.S2TError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


# Raised and caught inside s2t, never seen by a command: each is turned into an S2TError (or an answer) where caught.
INTERNAL_ERRORS = {"RowError", "HiddenArgumentError", "CannotReload", "MissingModuleError", "GgufRefused",
                   "TokenizerError", "Refusal", "SignatureError"}


def test_every_error_class_of_s2t_derives_from_the_one_base():
    import ast

    # The layers below s2t's own (backends, wire, clients, legacy, gateway) raise their own errors, which s2t turns
    # into S2TErrors where it calls them: they cannot import s2t.errors (tests/unit/test_architecture.py).
    below = [ROOT / "s2t" / name for name in ("wire", "legacy", "gateway")]  # backends/, clients/: not under s2t/
    defined = {node.name for path in (ROOT / "s2t").rglob("*.py") if not any(path.is_relative_to(b) for b in below)
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and any(getattr(base, "id", getattr(base, "attr", "")).endswith(
                   ("Error", "Exception", "Refused", "Timeout")) for base in node.bases)}
    derived = {cls.__name__ for cls in _every_s2t_error_class()}
    assert defined - derived - {"S2TError"} == INTERNAL_ERRORS


def test_every_project_error_leaves_the_command_line_with_its_own_exit_code():
    from s2t.cli.failures import exit_error
    classes = _every_s2t_error_class()
    assert {"ArtifactRefused", "RolloutError", "ConversionError", "ServerError", "GateRefused"} <= {
        c.__name__ for c in classes}
    for cls in classes:
        mapped = exit_error(cls("it went wrong"))
        assert mapped.exit_code == cls.exit_code and mapped.message == "it went wrong", cls
    assert {c.__name__: c.exit_code for c in classes}["ArtifactRefused"] == errors.GATE_REFUSED


@pytest.mark.parametrize("err, code", [
    (errors.GateRefused("parity over tolerance"), errors.GATE_REFUSED),
    (errors.RecordRejected("features.age: missing"), errors.REJECTED),
    (ConnectionRefusedError(111, "Connection refused"), errors.UNREACHABLE),
    (FileNotFoundError(2, "No such file"), errors.FAILED),
    (ValueError("window_size must be >= 1"), errors.FAILED),
    (PermissionError(13, "Permission denied"), errors.FAILED),
    (_triton_error("StatusCode.INTERNAL", "model failed"), errors.FAILED),
    (KeyError("a bug"), None),
    (TypeError("a bug"), None),
], ids=["gate", "record", "refused", "missing-file", "bad-value", "permission", "server-refusal", "key-bug", "type-bug"])
def test_errors_map_to_exit_codes_in_one_place_and_bugs_keep_their_traceback(err, code):
    from s2t.cli.failures import exit_error
    mapped = exit_error(err)
    assert (mapped.exit_code if mapped else None) == code


def test_a_failure_names_what_the_command_was_doing():
    from s2t.cli.failures import about, exit_error
    with pytest.raises(OSError) as raised:
        with about("cannot read localhost:1/metrics: "):
            raise ConnectionRefusedError(111, "Connection refused")
    mapped = exit_error(raised.value)
    assert mapped.exit_code == errors.UNREACHABLE
    assert mapped.message.startswith("server unreachable: cannot read localhost:1/metrics: ")
