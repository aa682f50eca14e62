"""Options that several `s2t` commands share, spelled one way: `--http-url` / `--grpc-url` for the server,
`--repository` for the model repository, `--json` for scripts.

Earlier spellings (`--url`, `--triton-url`, `--model-repository`) still parse but are left out of the help.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

HTTP_URL_ENV = ("S2T_HTTP_URL", "S2T_URL")
GRPC_URL_ENV = "S2T_GRPC_URL"


class AliasedOption(click.Option):
    """An option with old names that still work but are not shown in `--help`."""

    def __init__(self, param_decls, hidden_aliases: tuple[str, ...] = (), **attrs):
        super().__init__([*param_decls, *hidden_aliases], **attrs)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def http_url_option(help_text: str, name: str = "url", **attrs):
    return click.option("--http-url", name, cls=AliasedOption, hidden_aliases=("--url",), envvar=list(HTTP_URL_ENV),
                        metavar="HOST:PORT", help=help_text + f" [env: {HTTP_URL_ENV[0]}]", **attrs)


def grpc_url_option(help_text: str, name: str = "url", aliases: tuple[str, ...] = ("--url",),
                    envvar: str | None = GRPC_URL_ENV, **attrs):
    return click.option("--grpc-url", name, cls=AliasedOption, hidden_aliases=aliases, envvar=envvar,
                        metavar="HOST:PORT", help=help_text + (f" [env: {envvar}]" if envvar else ""), **attrs)


def repositories_option(help_text: str = "a model repository (repeatable) [default: ./model_repository and "
                                         "./ensembles]"):
    return click.option("--repository", "repositories", cls=AliasedOption, hidden_aliases=("--model-repository",),
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
