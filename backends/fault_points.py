"""Faults on purpose, at named points, so that tests can prove every catch-all path against the real server.

Some failures cannot be caused from outside once the inputs are handled (a bug, a stub out of memory), yet the
path that answers them must still answer every request of the batch on its own. `S2T_FAULT_POINTS` in the
server's environment names points and the share of batches that fail there, e.g.
`skill_adapter.execute=0.5,risk_stream.timer=1`; each python model calls `check(name)` where its catch-all
begins. Unset (every deployment), `check` is one lookup in an empty dict.
"""
from __future__ import annotations

import os
import random

ENVIRONMENT_VARIABLE = "S2T_FAULT_POINTS"


class InjectedFault(RuntimeError):
    """Raised at a fault point; handled exactly as an unexpected exception there."""


def parse(text: str) -> dict[str, float]:
    """"name=share,name" -> {name: share}; a name alone fails every time."""
    points = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, share = item.partition("=")
        value = float(share) if share else 1.0
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}: share of {name} must be within 0..1, got {value}")
        points[name.strip()] = value
    return points


_POINTS = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))


def check(name: str) -> None:
    share = _POINTS.get(name)
    if share is not None and random.random() < share:
        raise InjectedFault(f"fault injected at {name} ({ENVIRONMENT_VARIABLE})")
