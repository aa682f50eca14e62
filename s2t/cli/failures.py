"""Errors become exit codes here, once for every command (the codes: s2t/errors.py).

A command lets errors go; this group turns them into a one-line message and the exit code they mean. What is not
expected (a bug: TypeError, KeyError, ...) keeps its traceback, so that it can be reported and fixed.
"""
from __future__ import annotations

from contextlib import contextmanager

import click

from s2t import errors
from s2t.control.reachability import is_unreachable

# What goes wrong outside the program, and what a library says of a file or value it was given: a message is all
# a person needs (a missing file, a port in use, a time limit, a config that does not parse, the server refusing).
ENVIRONMENT_FAILURES = (OSError, TimeoutError, ValueError, RuntimeError)


def _server_refusal(err: BaseException) -> bool:
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException)


def exit_error(err: Exception) -> click.ClickException | None:
    """The click error that exits with the code `err` deserves, or None for an error that is a bug."""
    context = "".join(getattr(err, "__notes__", ()))
    message = f"{context}{err}" if str(err) else f"{context}{type(err).__name__}"
    if is_unreachable(err):
        code, message = errors.UNREACHABLE, f"server unreachable: {message}"
    elif isinstance(err, errors.S2TError):
        code = err.exit_code
    elif isinstance(err, ENVIRONMENT_FAILURES) or _server_refusal(err):
        code = errors.FAILED
    else:
        return None
    failure = click.ClickException(message)
    failure.exit_code = code
    return failure


@contextmanager
def about(what: str):
    """Says what was being done (`what`, e.g. `localhost:8000: `) in front of the message of an error raised inside."""
    try:
        yield
    except Exception as err:  # re-raised: only its message gains the context
        err.add_note(what)
        raise


class S2TGroup(click.Group):
    """The `s2t` group: every command's errors leave through `exit_error`."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as err:  # mapped to its exit code, or re-raised as the bug it is
            failure = exit_error(err)
            if failure is None:
                raise
            raise failure from None
