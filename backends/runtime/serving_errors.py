"""One error vocabulary for every model: what went wrong for one request, and the Triton code its caller gets.

The kind sits on the exception (`InvalidInput`, `Unavailable`, `InternalError`); `TRITON_CODE` maps a kind to
the name of the `pb_utils.TritonError` code, and `from_triton_code` classifies an error another model answered
(a BLS call) by its code, never by its message text. Nothing here imports Triton: the model files pass
`pb_utils.TritonError` in, and build a new one for every response (Triton 2.51's python backend crashes the
server when one error object is shared by several responses).
"""
from __future__ import annotations

import re
from typing import Sequence

INVALID, UNAVAILABLE, INTERNAL = "invalid", "unavailable", "internal"
TRITON_CODE = {INVALID: "INVALID_ARG", UNAVAILABLE: "UNAVAILABLE", INTERNAL: "INTERNAL"}
# The codes pb_utils.TritonError defines in 2.51, by name.
TRITON_CODE_NAMES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
                     "ALREADY_EXISTS", "CANCELLED")
# Triton prefixes a step's error with the ensemble's name; the caller asked about its record, not about how the
# pipeline is built.
_ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")


class ServingError(Exception):
    """A request (or a record of it) cannot be answered; `message` is what its caller reads."""

    kind = INTERNAL

    def __init__(self, message: str):
        message = _ENSEMBLE_PREFIX.sub("", str(message))
        super().__init__(message)
        self.message = message


class InvalidInput(ServingError):
    """The caller sent something that can never be answered as sent (name the field and the reason)."""

    kind = INVALID


class Unavailable(ServingError):
    """Not now: overloaded, shutting down, or a component is not serving; the same request may succeed later."""

    kind = UNAVAILABLE


class NotAnsweredInTime(Unavailable):
    """No answer within the caller's time; the request may still be running where it was sent, so sending it again
    at once would add to the load that made it late (`batch_scoring.retrying` does not)."""


class NotServing(Unavailable):
    """The model or version asked for is not loaded (not yet published, being swapped, or retired)."""


class InternalError(ServingError):
    """A fault of the service itself; the details go to the log, never to the caller."""


_BY_KIND = {INVALID: InvalidInput, UNAVAILABLE: Unavailable, INTERNAL: InternalError}
_BY_TRITON_CODE = {"INVALID_ARG": InvalidInput, "UNAVAILABLE": NotServing, "NOT_FOUND": NotServing,
                   "CANCELLED": Unavailable}


def of_kind(kind: str, message: str) -> ServingError:
    return _BY_KIND.get(kind, InternalError)(message)


def from_triton_code(code: int, message: str, triton_error_class) -> ServingError:
    """The error another model answered, classified by its `code()` (an int of `triton_error_class`)."""
    for name in TRITON_CODE_NAMES:
        if getattr(triton_error_class, name, None) == code:
            return _BY_TRITON_CODE.get(name, InternalError)(message)
    return InternalError(message)


def triton_error(err: ServingError, triton_error_class):
    """A new `triton_error_class` (pb_utils.TritonError) for one response: never share the object."""
    return triton_error_class(err.message, getattr(triton_error_class, TRITON_CODE[err.kind]))


def request_error(errors: Sequence[object | None]) -> str | None:
    """The message for a request whose rows include bad ones (each row's error, None for a good row); None when
    every row is good."""
    bad = [(i, e) for i, e in enumerate(errors) if e is not None]
    if not bad:
        return None
    if len(errors) == 1:
        return str(bad[0][1])
    return "; ".join(f"record {i}: {e}" for i, e in bad)
