"""A child process that ends with the process that started it: what the keeper's tritonserver and a gRPC front of
its own need, so that neither outlives a killed parent."""
from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: SIGTERM (a draining stop) when the process that started it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
