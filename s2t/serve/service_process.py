"""An `s2t` service (`legacy serve`, `gateway`) as a child process: started, waited for until it says it is ready,
stopped with SIGTERM. Used by `s2t bench --mode cutover` and the tests, which start them as an operator would."""
from __future__ import annotations

import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from s2t.errors import S2TError

S2T = Path(sys.executable).parent / "s2t"


class ServiceError(S2TError, RuntimeError):
    pass


def start(args: list[str], ready_prefix: str, timeout: float = 120.0,
          log: Path | None = None) -> tuple[subprocess.Popen, str]:
    """`s2t ARGS...` started; returns once a line starting with `ready_prefix` came out (stdout or stderr), with
    that line. Fails fast, with what the process said, when it exits first. With `log`, everything it says (the
    lines before ready included) is also written there."""
    process = subprocess.Popen([str(S2T), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], 0.5)
        if readable:
            line = process.stdout.readline()
            seen.append(line)
            if line.startswith(ready_prefix):
                # Keep reading: a service that logs into a full pipe would block.
                reader = process.stdout.read if log is None else lambda: _copy(process.stdout, seen, log)
                threading.Thread(target=reader, name="service-output", daemon=True).start()
                return process, line
        if process.poll() is not None:
            raise ServiceError(f"s2t {' '.join(args)} exited with {process.returncode}: {''.join(seen)}"
                               f"{process.stdout.read()}")
    process.kill()
    process.wait()
    raise ServiceError(f"s2t {' '.join(args)} did not say {ready_prefix!r} within {timeout:.0f} s: {''.join(seen)}")


def _copy(output, seen: list[str], log: Path) -> None:
    with log.open("w") as out:
        out.writelines(seen)
        for line in output:
            out.write(line)
            out.flush()


def stop(process: subprocess.Popen, timeout: float = 30.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
