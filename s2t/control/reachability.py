"""Whether a Triton server answers, and whether an error says that nothing did or that the request was bad.

Checked by the commands before they change anything, and by the command line when it maps an error to its exit
code (s2t/errors.py). tritonclient is imported here and not in s2t/errors.py, which the serving image's keeper
imports: the image installs only what its modules import.
"""
from __future__ import annotations

import socket
import urllib.error

from s2t.errors import ServerUnreachable
from s2t.triton_admin import TritonAdmin

# A server that takes longer than this to answer its liveness URL is taken for unreachable.
CHECK_TIMEOUT_S = 10.0


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
    try:
        if protocol == "grpc":
            _grpc_answers(url)
        else:
            # The standard library's client: a rollback changes what is served right after this check, and
            # tritonclient's HTTP client (gevent) is only needed once the change is made.
            TritonAdmin(url).check_live(CHECK_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - whatever the reason, no Triton answers there
        reason = str(err) or type(err).__name__
        raise ServerUnreachable(f"server unreachable: no Triton answers {protocol.upper()} at {url} ({reason}); "
                                "nothing was changed") from None


def _grpc_answers(url: str) -> None:
    import tritonclient.grpc as grpc

    triton = grpc.InferenceServerClient(url)
    try:
        triton.is_server_live()
    finally:
        triton.close()
