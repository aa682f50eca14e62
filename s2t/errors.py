"""The errors of skill2triton and the exit code each one means to `s2t`.

Scripts branch on these codes: a refused gate is an answer about the model, an unreachable server is a fact about
the network, a usage error is a mistake in the command line; each gets its own code. Every error the project raises
on purpose derives from `S2TError` and names its code once, in its class; the command line maps them in one place
(s2t/cli/failures.py). Standard library only, even inside functions: the serving image's keeper imports modules
that raise these, and the images install only what their modules import.
"""
from __future__ import annotations


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
