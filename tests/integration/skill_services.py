"""The legacy Skill services as processes, started the way an operator starts them (`s2t legacy serve`,
`s2t gateway`), each waited for until it says it listens, and failing fast with its output if it dies first."""
from __future__ import annotations

import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from clients.legacy_record import to_protobuf

S2T = Path(sys.executable).parent / "s2t"


def skill_records(german_credit_data, rows, prefix="legacy"):
    records = german_credit_data.records()
    return [to_protobuf({"request_id": f"{prefix}-{i}", "stream_id": "batch", "sequence_id": int(i),
                         "event_time_ms": 1_700_000_000_000 + int(i), "features": records[i]}) for i in rows]


def start(args: list[str], ready_prefix: str, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    """`s2t ARGS...` started; returns once a line starting with `ready_prefix` came out (stdout or stderr)."""
    process = subprocess.Popen([str(S2T), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 0.5)
        if readable:
            line = process.stdout.readline()
            seen.append(line)
            if line.startswith(ready_prefix):
                return process, line
        if process.poll() is not None:
            pytest.fail(f"s2t {' '.join(args)} exited with {process.returncode}: {''.join(seen)}"
                        f"{process.stdout.read()}")
    process.kill()
    pytest.fail(f"s2t {' '.join(args)} did not say {ready_prefix!r} within {timeout:.0f} s: {''.join(seen)}")


def stop(process: subprocess.Popen, timeout: float = 30.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise


@contextmanager
def running(args: list[str], ready_prefix: str):
    process, _ = start(args, ready_prefix)
    try:
        yield process
    finally:
        stop(process)
