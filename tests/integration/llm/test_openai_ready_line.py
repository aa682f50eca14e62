"""`s2t serve --llm` prints `ready:` only once the OpenAI-compatible API answers too: a client that calls it the moment
it reads the line, without a retry, is answered."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from tests.conftest import ROOT, free_port


def test_the_openai_api_answers_the_moment_s2t_serve_says_ready(built_artifacts):
    ports = {name: free_port() for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "SUPERVISOR_PORT", "OPENAI_PORT")}
    env = {**os.environ, **{name: str(port) for name, port in ports.items()}}
    process = subprocess.Popen([str(Path(sys.executable).parent / "s2t"), "serve", "--llm", "--exit-timeout", "5"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, "s2t serve exited before it was ready:\n" + "".join(seen[-40:])
            seen.append(line)
            if line.startswith("ready:"):
                break
        # One attempt, at once: a port not yet answering is a failure here, not something to wait for.
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['OPENAI_PORT']}/v1/models", timeout=10) as response:
            assert response.status == 200
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["llm"]
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
