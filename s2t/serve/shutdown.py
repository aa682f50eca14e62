"""How an `s2t` service stops: SIGINT or SIGTERM sets an event the command waits on; a gRPC service gives the calls in
flight a grace period, then the process leaves at once."""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

GRPC_STOP_GRACE_S = 10.0
# Past the grace: the gateway then gives its own calls to Triton up to 5 s to end (s2t.gateway.triton_infer).
GRPC_STOP_MARGIN_S = 10.0


def stop_on_signals() -> threading.Event:
    """Set by the first SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def wait_for_stop(stop: threading.Event, poll_s: float = 0.5) -> None:
    """Returns once `stop` is set. Waits in slices: a signal the kernel delivers to another thread (gRPC's, ONNX
    Runtime's, TensorFlow's) only runs its Python handler when the main thread runs again, and a wait without a
    timeout would never let it."""
    while not stop.wait(poll_s):
        pass


def stop_grpc_service(server, say: Callable[[str], None], grace_s: float = GRPC_STOP_GRACE_S) -> None:
    """Calls in flight get `grace_s` to finish, then are cancelled. The wait is bounded: gRPC's shutdown event can
    stay unset after a call whose bytes did not parse, and the process must exit on SIGTERM all the same."""
    say("stopping: finishing calls in flight")
    if not server.stop(grace=grace_s).wait(timeout=grace_s + GRPC_STOP_MARGIN_S):
        say("stopped: gRPC did not confirm its shutdown; exiting anyway")


def exit_after_shutdown() -> None:
    """The service has stopped and said so: leave now. The interpreter's own exit joins every gRPC worker thread,
    and one still inside a cancelled call would hold a stopped service up past its grace period."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
