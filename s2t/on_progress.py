"""How long work tells how far it got, with no terminal of its own: `on_progress(done, total, label)`.

`done` out of `total` units are finished and `label` names what runs now. A report whose `done` goes back (a stage
starting over from 0) or whose `total` changes begins a new stage. The command line draws it (s2t/cli/progress.py);
the modules that do the work only call it.
"""
from __future__ import annotations

from typing import Callable

OnProgress = Callable[[int, int, str], None]


def no_progress(done: int, total: int, label: str) -> None:
    """The default: nobody is watching."""
