"""The exit codes of every `s2t` command, and the errors that carry them.

Scripts branch on these: a refused gate is an answer about the model, an unreachable server is a fact about the
network, a usage error is a mistake in the command line; each gets its own code.
"""
from __future__ import annotations

import socket
import urllib.error

import click

OK = 0
FAILED = 1
USAGE = 2
GATE_REFUSED = 3
UNREACHABLE = 4
REJECTED = 5

MEANINGS = {
    OK: "done; a gate passed",
    FAILED: "the command could not do its work (a missing file, an artifact that cannot be read, a change the "
            "server refused, an unexpected error)",
    USAGE: "the command line is wrong: unknown option, missing argument, options that exclude each other",
    GATE_REFUSED: "a gate said no: parity over tolerance, publish refused the artifact, the automated canary "
                  "rolled back, check-config found problems, a stream replay lost order or records, a soak grew, "
                  "`soak --hostile` found a guarantee not kept",
    UNREACHABLE: "the server (Triton's HTTP or gRPC endpoint, or a metrics endpoint) could not be reached",
    REJECTED: "the server answered the request with an error of its own: the record is invalid (the message names "
              "the field)",
}


class GateRefused(click.ClickException):
    exit_code = GATE_REFUSED


class ServerUnreachable(click.ClickException):
    exit_code = UNREACHABLE


class RecordRejected(click.ClickException):
    exit_code = REJECTED


# gRPC says UNAVAILABLE both when nothing listens and when a model is not serving: only its connection messages
# mean the former.
_NO_CONNECTION = ("failed to connect", "connection refused", "errors resolving", "dns resolution failed")


def is_unreachable(err: BaseException) -> bool:
    """True where `err` says that nothing answered at the address: refused, unknown host, connect timeout."""
    from tritonclient.utils import InferenceServerException

    if isinstance(err, urllib.error.HTTPError):
        return False  # something answered
    if isinstance(err, urllib.error.URLError):
        return isinstance(err.reason, OSError) and is_unreachable(err.reason)
    if isinstance(err, (ConnectionRefusedError, ConnectionResetError, socket.gaierror, socket.timeout)):
        return True
    if isinstance(err, InferenceServerException):
        message = (err.message() or "").lower()
        return err.status() == "StatusCode.UNAVAILABLE" and any(m in message for m in _NO_CONNECTION)
    return False


def is_invalid_input(err: BaseException) -> bool:
    """True where the server judged the request itself invalid (HTTP 400, gRPC INVALID_ARGUMENT)."""
    from tritonclient.utils import InferenceServerException

    return isinstance(err, InferenceServerException) and err.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def failure(err: BaseException, context: str = "") -> click.ClickException:
    """The click error that exits with the code `err` deserves; `context` says what was being done."""
    message = f"{context}{err}" if str(err) else f"{context}{type(err).__name__}"
    if is_unreachable(err):
        return ServerUnreachable(f"server unreachable: {message}")
    return click.ClickException(message)


def require_reachable(url: str | None, protocol: str = "http") -> None:
    """Checked before a command changes anything, so that an unreachable server leaves nothing half done."""
    if not url:
        return
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    try:
        triton = client.InferenceServerClient(url)
        try:
            triton.is_server_live()
        finally:
            triton.close()
    except Exception as err:  # noqa: BLE001 - whatever the reason, no Triton answers there
        reason = str(err) or type(err).__name__
        raise ServerUnreachable(f"server unreachable: no Triton answers {protocol.upper()} at {url} ({reason}); "
                                "nothing was changed") from None


class ExitCodeGroup(click.Group):
    """Whatever command lets a connection error escape, it exits UNREACHABLE, not with a traceback and 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as err:  # re-raised unless it is a connection error
            if is_unreachable(err):
                raise failure(err) from None
            raise
