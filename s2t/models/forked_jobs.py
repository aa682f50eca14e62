"""Jobs each run in a child forked from a process that has paid for its imports once (TensorFlow and tf2onnx take
most of a conversion's time): at most `workers` at a time, each isolated from the others (its own state, its own
failure), each child's output in its job's log."""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from typing import Callable, Sequence

POLL_S = 0.02


def _child(job: dict, work: Callable[[dict], int]) -> None:
    """Never returns: the job's exit code ends the child (1 for an exception it raised, traceback in its log)."""
    code = 1
    try:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # Python's own streams too, where the parent had replaced them (a test's capture).
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        code = work(job)
    except SystemExit as exited:  # sys.exit(n) in the job: n, as in a process of its own
        code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever the job raised is its failure, told in its log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(jobs: Sequence[dict], work: Callable[[dict], int], workers: int, timeout_s: float) -> list[int]:
    """`work(job)` for each job in a forked child: exit codes in the jobs' order (negative: the signal that ended
    it); a child still running after `timeout_s` is killed (-9)."""
    codes: list[int] = [1] * len(jobs)
    running: dict[int, tuple[int, float]] = {}
    waiting = list(range(len(jobs)))
    while waiting or running:
        while waiting and len(running) < max(1, workers):
            index = waiting.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(jobs[index], work)
            running[pid] = (index, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for child, (_, started) in running.items():
                if now - started > timeout_s:
                    os.kill(child, signal.SIGKILL)
            time.sleep(POLL_S)
            continue
        index, _ = running.pop(pid)
        codes[index] = os.waitstatus_to_exitcode(status)
    return codes
