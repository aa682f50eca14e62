"""`s2t serve`, `s2t gateway`, `s2t canary --auto`: one source of defaults (the options dataclasses), keyword-only,
`S2T_` variables."""
from __future__ import annotations

import dataclasses
import inspect

import click
import pytest
from click.testing import CliRunner

from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES
from s2t.cli.serve import gateway, serve
from s2t.gateway import gateway_options
from s2t.gateway.call_admission import AdmissionLimits
from s2t.gateway.gateway_options import GatewayOptions
from s2t.gateway.skill_gateway import CallLimits, serve as serve_gateway
from s2t.serve.grpc_front import DEFAULT_MAX_CALLS
from s2t.serve.serve_options import ServeOptions

# What click gives an option without a default (None before click 8.3).
UNSET = getattr(click.core, "UNSET", None)
# Option name -> field, where they differ.
SERVE_FIELDS = {"exit_timeout": "exit_timeout_s", "rate_limit": "rate_limit_slots"}


def _defaults(command: click.Command, fields: set[str], renamed: dict[str, str]) -> dict[str, tuple]:
    """option field -> (the command line's default, the dataclass's)."""
    pairs = {}
    for param in command.params:
        field = renamed.get(param.name, param.name)
        if isinstance(param, click.Option) and field in fields:
            given = None if param.default is UNSET else param.default
            pairs[field] = (given, getattr(ServeOptions if command is serve else GatewayOptions, field, None))
    return pairs


@pytest.mark.parametrize("command, options", [(serve, ServeOptions), (gateway, GatewayOptions)])
def test_the_command_lines_defaults_are_the_options_dataclass_ones(command, options):
    fields = {f.name for f in dataclasses.fields(options) if f.default is not dataclasses.MISSING}
    pairs = _defaults(command, fields, SERVE_FIELDS if command is serve else {})
    skipped = {"openai_port"}  # the command line's 9000 applies with --llm only; the server's 0 means none
    assert len(pairs) >= len(fields) - len(skipped) - 1
    assert {f: p for f, p in pairs.items() if f not in skipped and p[0] != p[1]} == {}


def test_the_library_takes_the_gateways_defaults_from_its_options():
    limits, admission = CallLimits(), AdmissionLimits()
    assert (limits.timeout_s, limits.max_records, limits.max_message_bytes) == (
        GatewayOptions.call_timeout_s, GatewayOptions.max_records, GatewayOptions.max_message_bytes)
    library = inspect.signature(serve_gateway).parameters
    assert (library["window_size"].default, library["workers"].default, library["model"].default) == (
        GatewayOptions.window_size, GatewayOptions.workers, GatewayOptions.model)
    # One caller may take every slot by default, in the library as through `s2t gateway`.
    assert admission.slots == admission.per_caller == GatewayOptions.workers
    assert (admission.call_timeout_s, admission.idle_timeout_s) == (GatewayOptions.call_timeout_s,
                                                                     GatewayOptions.idle_timeout_s)
    assert AdmissionLimits(slots=4).per_caller == 4
    assert gateway_options.RECORD_BYTES == DEFAULT_MAX_RECORD_BYTES
    assert DEFAULT_MAX_CALLS == ServeOptions.grpc_max_calls


@pytest.mark.parametrize("options", [ServeOptions, GatewayOptions])
def test_options_are_keyword_only_and_frozen(options):
    with pytest.raises(TypeError):
        options(("repository",)) if options is ServeOptions else options(50051)
    built = options(repositories=()) if options is ServeOptions else options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.model = "x"


@pytest.fixture
def served(monkeypatch):
    """What `s2t serve` would run with: its options, captured instead of serving."""
    from s2t.serve import foreground
    captured = []

    def capture(options, environ, log):
        captured.append(options)
        return 0
    monkeypatch.setattr(foreground, "serve", capture)
    return captured


@pytest.mark.parametrize("env, expected", [
    ({}, 8000),
    ({"HTTP_PORT": "18000"}, 18000),
    ({"S2T_HTTP_PORT": "28000"}, 28000),
    # The prefixed name wins over the older one.
    ({"S2T_HTTP_PORT": "28000", "HTTP_PORT": "18000"}, 28000),
])
def test_ports_are_read_from_s2t_variables_and_still_from_the_older_names(served, monkeypatch, env, expected):
    for name in ("S2T_HTTP_PORT", "HTTP_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(serve, [], env=env)
    assert result.exit_code == 0, result.output
    assert served[-1].http_port == expected


def test_the_automatic_canarys_limits_on_the_command_line_are_the_analysis_defaults():
    from s2t.cli.canary import canary
    from s2t.gate.canary_analysis import Limits as Judged
    from s2t.gate.canary_limits import Limits
    given = {p.name: p.default for p in canary.params}
    assert Judged is Limits
    assert (given["max_shadow_diff"], given["max_error_rate"], given["max_p99_ms"] / 1000, given["max_psi"],
            given["min_rows"]) == (Limits.max_shadow_mean_diff, Limits.max_error_rate, Limits.max_p99_seconds,
                                   Limits.max_psi, Limits.min_rows)
    with pytest.raises(TypeError):
        Limits(0.01)


def test_bench_modes_are_keyword_only():
    from s2t.bench.harness.modes import MODES, Mode
    assert MODES["quick"].http_rounds == 2 and MODES["full"].protocol_rounds == 5
    with pytest.raises(TypeError):
        Mode("smoke", 100)
