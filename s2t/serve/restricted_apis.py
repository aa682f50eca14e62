"""Which of tritonserver's APIs answer only callers with the admin key, on HTTP and on gRPC.

Triton protects only the categories a `--http-restricted-api` / `--grpc-restricted-protocol` option lists; the rest
answer anyone. Shared memory (system and CUDA) lets a caller map memory of the server's host, logging and trace
settings let anyone raise verbosity or write trace files, and Triton 2.51's error messages can leak the python
backend's shared-memory key (CVE-2025-23319/23320/23334): so those are always restricted. With a key configured, the
repository API (load, unload, index) is restricted too; without one, shared memory, logging and trace are locked
with a key made for this start and known to nobody, and the repository API stays as before (poll mode refuses
load and unload anyway).

Every way the server starts goes through `restrict` (`s2t serve` through TritonServer.command, containers through
the keeper), so a command written without these options is still served restricted. Standard library only.
"""
from __future__ import annotations

import secrets

HEADER = "admin-key"
OPTIONS = ("--http-restricted-api=", "--grpc-restricted-protocol=")
# Categories as tritonserver 2.51 spells them (`tritonserver --help`); "shared-memory" covers system and CUDA.
ALWAYS = ("shared-memory", "logging", "trace")
WITH_KEY = ("model-repository", *ALWAYS)


def parse(value: str) -> tuple[list[str], str, str]:
    """`cat1,cat2:header=key` -> ([cat1, cat2], header, key)."""
    categories, _, rest = value.partition(":")
    header, _, key = rest.partition("=")
    return [c for c in categories.split(",") if c], header, key


def render(categories: list[str], header: str, key: str) -> str:
    return f"{','.join(categories)}:{header}={key}"


def configured_key(command: list[str]) -> str | None:
    """The key an option of `command` already guards the repository API with (a manifest's), if any."""
    for arg in command:
        for option in OPTIONS:
            if arg.startswith(option):
                categories, _, key = parse(arg[len(option):])
                if "model-repository" in categories and key:
                    return key
    return None


def restrict(command: list[str], admin_key: str | None = None) -> list[str]:
    """`command` (tritonserver and its options) with shared memory, logging and trace restricted on both protocols,
    and the repository API too when there is a key (`admin_key`, or the one an option of `command` already guards
    the repository API with on either protocol). Categories are added to an option already there (Triton takes one
    key per category); where there is none, one is appended, with that key or, without one, a key nobody knows."""
    admin_key = admin_key or configured_key(command)
    wanted = WITH_KEY if admin_key else ALWAYS
    key = admin_key or secrets.token_urlsafe(32)
    result = list(command)
    for option in OPTIONS:
        present = [i for i, arg in enumerate(result) if arg.startswith(option)]
        if not present:
            result.append(option + render(list(wanted), HEADER, key))
            continue
        listed = {c for i in present for c in parse(result[i][len(option):])[0]}
        missing = [c for c in wanted if c not in listed]
        if missing:
            last = present[-1]
            categories, header, value = parse(result[last][len(option):])
            result[last] = option + render(categories + missing, header, value)
    return result


def restricts_inference(command: list[str], option: str) -> bool:
    """Whether `command` restricts inference to a key with `option` (`--http-restricted-api` or
    `--grpc-restricted-protocol`), in its `--option=value` or its two-word form."""
    for arg, following in zip(command, [*command[1:], ""]):
        value = arg[len(option) + 1:] if arg.startswith(option + "=") else following if arg == option else None
        if value is not None and "inference" in parse(value)[0]:
            return True
    return False
