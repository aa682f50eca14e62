"""The errors of skill2triton and the exit code each one means to `s2t`.

Scripts branch on these codes: a refused gate is an answer about the model, an unreachable server is a fact about
the network, a usage error is a mistake in the command line; each gets its own code. Every error the project raises
on purpose derives from `S2TError` and names its code once, in its class; the command line maps them in one place
(s2t/cli/failures.py). Standard library only at import (tritonclient is imported where a check needs it): the
serving image's keeper imports modules that raise these.
"""
from __future__ import annotations

import socket
import urllib.error

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


class S2TError(Exception):
    """An error the project raises on purpose; its message is meant for the person who ran the command."""

    exit_code = FAILED


class GateRefused(S2TError):
    exit_code = GATE_REFUSED


class ServerUnreachable(S2TError):
    exit_code = UNREACHABLE


class RecordRejected(S2TError):
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
