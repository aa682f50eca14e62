"""Progress of long `s2t` work on stderr, so that minutes of TensorFlow, tf2onnx or load never look like a hang.
stdout stays the result's alone (with `--json`, one JSON document).

`step` frames one opaque piece of work: what it is, then how long it took. `progress` follows work that counts
(rows scored, benchmark points, seconds of a soak) through the modules' `on_progress(done, total, label)` callback
(s2t/on_progress.py): click's bar on a terminal; on anything else (CI logs, pipes) a line when a stage starts, at
each tenth of it and when it ends, so that a log shows the work moving and never holds a line per row.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

import click

CLEAR_LINE = "\r\033[2K"


@contextmanager
def step(what: str):
    click.echo(f"{what} ...", err=True)
    started = time.monotonic()
    try:
        yield
    except BaseException:
        click.echo(f"{what}: stopped after {time.monotonic() - started:.1f} s", err=True)
        raise
    click.echo(f"{what}: {time.monotonic() - started:.1f} s", err=True)


class Progress:
    """An `on_progress(done, total, label)` callback that draws on `stream`, plus `echo` for lines meant for people
    while a bar is drawn (they go above it, not through it)."""

    def __init__(self, what: str, unit: str, stream: TextIO | None = None, lines_per_stage: int = 10):
        self.what, self.unit, self.lines_per_stage = what, unit, lines_per_stage
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        self._bar = None
        self._done = self._total = 0
        self._label = ""
        self._started = time.monotonic()
        self._shown_step = -1
        self._in_stage = False

    def __call__(self, done: int, total: int, label: str) -> None:
        total = max(int(total), 0)
        done = min(max(int(done), 0), total)
        if not self._in_stage or done < self._done or total != self._total:
            self._begin_stage(total)
        self._done, self._label = done, label
        if self.terminal:
            self._bar.current_item = label
            if done > self._bar.pos:
                self._bar.update(done - self._bar.pos)
            else:
                self._bar.render_progress()
            return
        reached = done * self.lines_per_stage // total if total else self.lines_per_stage
        if reached > self._shown_step:
            self._shown_step = reached
            click.echo(f"{self.what}: {self._status()}", file=self.stream)

    def echo(self, line: str) -> None:
        if self.terminal and self._bar is not None:
            self.stream.write(CLEAR_LINE)
            click.echo(line, file=self.stream)
            self.stream.write("\r" + self._bar.format_progress_line())
            self.stream.flush()
        else:
            click.echo(line, file=self.stream)

    def close(self, stopped: bool = False) -> None:
        self._end_stage()
        if stopped and self._in_stage:
            click.echo(f"{self.what}: stopped at {self._status()}", file=self.stream)

    def _status(self) -> str:
        share = f" ({100 * self._done // self._total}%)" if self._total else ""
        took = f" after {time.monotonic() - self._started:.1f} s" if self._done else ""
        return f"{self._label}: {self._done}/{self._total} {self.unit}{share}{took}"

    def _begin_stage(self, total: int) -> None:
        self._end_stage()
        self._in_stage, self._done, self._total = True, 0, total
        self._started, self._shown_step = time.monotonic(), -1
        if self.terminal:
            self._bar = click.progressbar(length=total, label=f"{self.what} ({self.unit})", file=self.stream,
                                          show_pos=True, show_percent=True, show_eta=True,
                                          item_show_func=lambda label: label)

    def _end_stage(self) -> None:
        if self._bar is not None:
            self._bar.render_finish()
            self._bar = None


@contextmanager
def progress(what: str, unit: str, stream: TextIO | None = None) -> Iterator[Progress]:
    """`what` names the command's work (`parity`, `bench smoke`), `unit` what it counts (`rows`, `steps`, `s`)."""
    shown = Progress(what, unit, stream)
    try:
        yield shown
    except BaseException:
        shown.close(stopped=True)
        raise
    shown.close()
