"""Options that several `s2t` commands share, spelled one way: `--http-url` / `--grpc-url` for the server,
`--repository` for the model repository, `--json` for scripts; the default paths every command starts from.

The public contract (docs/cli.md) still names an older spelling on a few commands (`--url` on `parity`, `score`,
`promote`, `status` and `drift`, `--triton-url` on `gateway`, `--model-repository` on `serve`): those commands
accept it as a second name of the same option, kept out of `--help` so that the help shows one spelling.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

DEFAULT_DATA = Path("artifacts/data/germancredit.csv")
DEFAULT_SAVED_MODEL = Path("artifacts/legacy/risk_model")
DEFAULT_ONNX = Path("artifacts/onnx/risk_scorer.onnx")
DEFAULT_REPOSITORIES = (Path("model_repository"), Path("ensembles"))
LLM_REPOSITORY = Path("model_repository_llm")

HTTP_URL_ENV = "S2T_HTTP_URL"
GRPC_URL_ENV = "S2T_GRPC_URL"


class ContractOption(click.Option):
    """An option that also answers to the spelling the public contract names for its command, left out of the help
    (which shows the one current spelling)."""

    def __init__(self, param_decls, contract_spelling: str | None = None, **attrs):
        super().__init__([*param_decls, *([contract_spelling] if contract_spelling else [])], **attrs)
        self.contract_spelling = contract_spelling

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, [o for o in self.opts if o != self.contract_spelling]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def http_url_option(help_text: str, name: str = "url", envvar: str | None = HTTP_URL_ENV,
                    contract_spelling: str | None = None, **attrs):
    return click.option("--http-url", name, cls=ContractOption, contract_spelling=contract_spelling, envvar=envvar,
                        metavar="HOST:PORT", help=help_text + (f" [env: {envvar}]" if envvar else ""), **attrs)


def grpc_url_option(help_text: str, name: str = "url", envvar: str | None = GRPC_URL_ENV,
                    contract_spelling: str | None = None, **attrs):
    return click.option("--grpc-url", name, cls=ContractOption, contract_spelling=contract_spelling, envvar=envvar,
                        metavar="HOST:PORT", help=help_text + (f" [env: {envvar}]" if envvar else ""), **attrs)


def repositories_option(help_text: str = "a model repository (repeatable) [default: ./model_repository and "
                                         "./ensembles]", contract_spelling: str | None = None):
    return click.option("--repository", "repositories", cls=ContractOption, contract_spelling=contract_spelling,
                        multiple=True, type=click.Path(exists=True, path_type=Path), help=help_text)


json_option = click.option("--json", "as_json", is_flag=True,
                           help="print one JSON document on stdout (what is said to people goes to stderr)")


def emit(as_json: bool, document: dict, text: str) -> None:
    """The result: JSON on stdout and `text` on stderr for scripts, else `text` on stdout."""
    if as_json:
        click.echo(text, err=True)
        click.echo(json.dumps(document, indent=2, sort_keys=True))
    else:
        click.echo(text)


def server_address(http_url: str | None, grpc_url: str | None) -> tuple[str | None, str]:
    """(url, protocol) from --http-url / --grpc-url, at most one of them."""
    given = [(u, p) for u, p in ((http_url, "http"), (grpc_url, "grpc")) if u]
    if len(given) > 1:
        raise click.UsageError("give one server: --http-url or --grpc-url")
    return given[0] if given else (None, "http")


def log_to_stderr(line: str) -> None:
    click.echo(line, err=True)
