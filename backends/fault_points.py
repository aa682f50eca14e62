"""Faults on purpose, at named points, so that tests can prove every catch-all path against the real server.

Some failures cannot be caused from outside once the inputs are handled (a bug, a stub out of memory), yet the
path that answers them must still answer every request of the batch on its own. `S2T_FAULT_POINTS` in the
server's environment names points and the share of batches that fail there, e.g.
`skill_adapter.execute=0.5,risk_stream.timer=1`; each python model calls `check(name)` where its catch-all
begins. Unset (every deployment), `check` is one lookup in an empty dict.

`name=kill` instead stops the process there with SIGKILL, as the OOM killer or a power cut would: the control
commands call `check` at every boundary between two of their writes, so a test can prove that the next command
finds a repository it can serve from, wherever the previous one died.
"""
from __future__ import annotations

import os
import random
import signal

ENVIRONMENT_VARIABLE = "S2T_FAULT_POINTS"
KILL = "kill"


class InjectedFault(RuntimeError):
    """Raised at a fault point; handled exactly as an unexpected exception there."""


def parse(text: str) -> dict[str, float | str]:
    """"name=share,name,other=kill" -> {name: share, other: "kill"}; a name alone fails every time."""
    points: dict[str, float | str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, share = item.partition("=")
        if share.strip() == KILL:
            points[name.strip()] = KILL
            continue
        value = float(share) if share else 1.0
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}: share of {name} must be within 0..1, got {value}")
        points[name.strip()] = value
    return points


_POINTS = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))


def check(name: str) -> None:
    share = _POINTS.get(name)
    if share == KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if share is not None and random.random() < share:
        raise InjectedFault(f"fault injected at {name} ({ENVIRONMENT_VARIABLE})")
