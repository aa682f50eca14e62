"""Progress of long `s2t` work on stderr: what is being done, then how long it took, so that minutes of TensorFlow
or tf2onnx never look like a hang. stdout stays the result's alone."""
from __future__ import annotations

import time
from contextlib import contextmanager

import click


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
