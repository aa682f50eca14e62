"""Faults on purpose, at named points, so that tests can prove every catch-all path against the real server.

Some failures cannot be caused from outside once the inputs are handled (a bug, a stub out of memory), yet the
path that answers them must still answer every request of the batch on its own. `S2T_FAULT_POINTS` in the
server's environment names points and the share of batches that fail there, e.g.
`skill_adapter.execute=0.5,risk_stream.timer=1`; each python model calls `check(name)` where its catch-all
begins. Unset (every deployment), `check` is one lookup in an empty dict.

A kind instead of a share does something other than raise, at every pass or, with `:share`, at that share of
passes (`risk_pipeline.execute=segv:0.2`):
- `kill` stops the process with SIGKILL, as the OOM killer or a power cut would: the control commands call `check`
  at every boundary between two of their writes, so a test can prove that the next command finds a repository it
  can serve from, wherever the previous one died;
- `segv` dies of a real SIGSEGV (a read at address 0), as a crash in native code would: what the process's crash
  handlers leave in the log is what a real crash leaves;
- `exit` ends the process at once (`os._exit`) with EXIT_STATUS, without unwinding or clean-up;
- `hang` sleeps HANG_SECONDS holding the GIL, as native code stuck in a call would: nothing else in that
  interpreter runs meanwhile.
"""
from __future__ import annotations

import ctypes
import os
import random
import signal
from dataclasses import dataclass

ENVIRONMENT_VARIABLE = "S2T_FAULT_POINTS"
KILL, SEGV, EXIT, HANG = "kill", "segv", "exit", "hang"
EXIT_STATUS = 70
HANG_SECONDS = 24 * 3600


class InjectedFault(RuntimeError):
    """Raised at a fault point; handled exactly as an unexpected exception there."""


@dataclass(frozen=True)
class Action:
    """A fault point that does `kind` at `share` of its passes rather than raise."""

    kind: str
    share: float = 1.0


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _segv() -> None:
    ctypes.string_at(0)


def _exit() -> None:
    os._exit(EXIT_STATUS)


def _hang() -> None:
    # A PyDLL call keeps the GIL (a CDLL call would release it); None is the process's own symbols, libc's among them.
    ctypes.PyDLL(None).sleep(HANG_SECONDS)


_ACTIONS = {KILL: _kill, SEGV: _segv, EXIT: _exit, HANG: _hang}


def _share(name: str, text: str) -> float:
    value = float(text) if text else 1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}: share of {name} must be within 0..1, got {value}")
    return value


def parse(text: str) -> dict[str, float | Action]:
    """"name=share,name,other=kill,last=segv:0.1" -> {name: share, name: 1.0, other: Action("kill"),
    last: Action("segv", 0.1)}; a name alone fails every time."""
    points: dict[str, float | Action] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip()
        kind, _, share = value.strip().partition(":")
        points[name] = Action(kind, _share(name, share)) if kind in _ACTIONS else _share(name, value.strip())
    return points


_POINTS = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))


def check(name: str) -> None:
    point = _POINTS.get(name)
    if point is None:
        return
    if isinstance(point, Action):
        if random.random() < point.share:
            _ACTIONS[point.kind]()
    elif random.random() < point:
        raise InjectedFault(f"fault injected at {name} ({ENVIRONMENT_VARIABLE})")
