"""The README's commands, run as written against the real server.

Shell and Python blocks run against the test server, with the addresses `make serve` listens on
(localhost:8000/8001/8002) replaced by the server's. A block that is not meant to run here says so on the line
before it: `<!-- readme-test: skip (why) -->` (it sets up the machine, needs Docker, or runs for minutes) or
`<!-- readme-test: parse-only (why) -->` (it changes what is served or needs the reader's own files): each `s2t`
line of such a block is parsed by the CLI itself, every option and argument checked, without running it. The `s2t`
lines of the shell blocks in docs/ are parsed the same way.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from tests.conftest import ROOT
from s2t.cli import main

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MARKER = re.compile(r"<!-- readme-test: (skip|parse-only) \((.+)\) -->")
COMMAND_LANGUAGES = {"sh", "python"}
MAKE_SERVE_ADDRESSES = {"http": "localhost:8000", "grpc": "localhost:8001", "metrics": "localhost:8002"}


@dataclass(frozen=True)
class Block:
    line: int
    language: str
    code: str
    mode: str  # "run", "skip" or "parse-only"

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language}, {self.mode})"


def blocks(text: str) -> list[Block]:
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = MARKER.fullmatch(lines[i - 1].strip()) if i else None
        found.append(Block(i + 1, fence.group(1), "\n".join(lines[i + 1:end]), marker.group(1) if marker else "run"))
        i = end + 1
    return found


def commands(block: Block) -> list[str]:
    """The block's shell commands, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.code)
    return [line for line in (shlex.split(raw, comments=True) for raw in joined.splitlines()) if line]


README_BLOCKS = [b for b in blocks(README.read_text()) if b.language in COMMAND_LANGUAGES]
RUN = [b for b in README_BLOCKS if b.mode == "run"]
PARSE_ONLY = [b for b in README_BLOCKS if b.mode == "parse-only"]


def test_the_readme_keeps_exactly_the_two_set_up_commands_and_marks_them_not_run():
    [setup] = [b for b in README_BLOCKS if "make serve" in b.code]
    assert setup.mode == "skip"
    assert [c[:2] for c in commands(setup)] == [["make", "serve"], ["make", "test"]]


def test_every_marker_precedes_a_command_block():
    text = README.read_text()
    markers = len(re.findall(r"<!-- readme-test:", text))
    assert markers == len([b for b in README_BLOCKS if b.mode != "run"]), "a marker that marks no sh/python block"


def test_the_readme_has_blocks_that_run_against_the_server():
    assert {b.language for b in RUN} == COMMAND_LANGUAGES and PARSE_ONLY


def parse(args: list[str]) -> None:
    """What click does before it calls a command: resolve the subcommands, parse and convert every parameter."""
    group, ctx, rest = main, main.make_context("s2t", [], resilient_parsing=True), list(args)
    while True:
        name, command, rest = group.resolve_command(ctx, rest)
        if not isinstance(command, click.Group):
            command.make_context(name, rest, parent=ctx)
            return
        group, ctx = command, command.make_context(name, [], parent=ctx, resilient_parsing=True)


@pytest.mark.parametrize("block", PARSE_ONLY, ids=str)
def test_every_s2t_line_of_a_parse_only_block_parses(block):
    lines = commands(block)
    assert lines and all(c[0] == "s2t" for c in lines), f"{block}: parse-only blocks hold s2t commands only"
    parse_s2t_lines(block, str(block))


def parse_s2t_lines(block: Block, where: str) -> None:
    for line in commands(block):
        if Path(line[0]).name != "s2t":
            continue
        try:
            parse(line[1:])
        except click.BadParameter as err:
            # The reader's own files (a SavedModel, a CSV) are not in the repository: that is the one thing
            # these lines may lack.
            assert "does not exist" in err.format_message(), f"{where}: {shlex.join(line)}: {err.format_message()}"
        except click.UsageError as err:
            pytest.fail(f"{where}: {shlex.join(line)}: {err.format_message()}")


@pytest.mark.parametrize("document", DOCS, ids=lambda path: path.name)
def test_every_s2t_line_in_the_docs_parses(document):
    for block in blocks(document.read_text()):
        if block.language == "sh":
            parse_s2t_lines(block, f"{document.name}:{block.line}")


def test_parse_catches_an_unknown_option_and_a_missing_argument():
    with pytest.raises(click.UsageError):
        parse(["stream", "--no-such-option"])
    with pytest.raises(click.UsageError):
        parse(["canary"])


def shown_answers(block: Block) -> list[str]:
    """What a block's comments show a command printing: the `# {...}` lines right after it, joined without their
    indentation."""
    answers, current = [], None
    for line in block.code.splitlines() + [""]:
        text = line.strip()
        if text.startswith("#") and (current is not None or text[1:].strip().startswith("{")):
            current = (current or "") + text[1:].strip()
            continue
        if current:
            answers.append(current)
        current = None
    return answers


def answer_pattern(shown: str) -> re.Pattern:
    """The shown answer as a pattern: exact, except that `...` after a digit stands for the digits left out."""
    return re.compile(re.sub(r"(?<=\d)\\\.\\\.\\\.", r"\\d*", re.escape(shown)))


@pytest.mark.parametrize("shown, printed, matches", [
    ('{"data":[0.47...]}', '{"data":[0.4705159664154053]}', True),
    ('{"data":[0.47...]}', '{"data":[0.7305159664154053]}', False),
    ('{"data":["REVIEW"]}', '{"data":["DECLINE"]}', False),
    ('{"a":1,...}', '{"a":1,...}', True),
])
def test_a_shown_answer_leaves_out_only_the_digits_after_its_dots(shown, printed, matches):
    assert bool(answer_pattern(shown).search(printed)) is matches


def test_the_curl_example_shows_an_answer_the_test_compares():
    [curl] = [b for b in RUN if "risk_pipeline/infer" in b.code and b.code.lstrip().startswith("curl")]
    [shown] = shown_answers(curl)
    assert '"name":"probability"' in shown and '"name":"decision"' in shown


def for_server(code: str, server) -> str:
    addresses = {"http": server.http_url, "grpc": server.grpc_url, "metrics": f"localhost:{server.metrics_port}"}
    for kind, address in MAKE_SERVE_ADDRESSES.items():
        code = code.replace(address, addresses[kind])
    return code


@pytest.mark.parametrize("block", RUN, ids=str)
def test_every_readme_block_runs_against_the_server(triton, block):
    code = for_server(block.code, triton)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if block.language == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{block}:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{block} printed nothing"
    assert '"error"' not in done.stdout, f"{block}: {done.stdout[-2000:]}"
    for shown in shown_answers(block):
        assert answer_pattern(shown).search(done.stdout), f"{block} shows {shown}, the server answered {done.stdout}"
