"""docs/streaming.md's tritonclient example, run as written against the real server: a record's stream_id is the
stream's correlation id, a string one included; a record on another stream is refused naming the field."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.integration.test_readme import blocks, for_server

STREAMING = ROOT / "docs" / "streaming.md"


def _stream_example():
    [block] = [b for b in blocks(STREAMING.read_text())
               if b.language == "python" and '"risk_stream"' in b.code and "sequence_id=stream" in b.code]
    return block


def _shown_output(code: str) -> list[str]:
    """The comment lines that end the block: what it prints."""
    shown = []
    for line in reversed(code.splitlines()):
        if not line.startswith("# "):
            break
        shown.insert(0, line[2:])
    return shown


def test_the_streaming_example_sends_a_record_on_the_stream_its_stream_id_names(triton):
    block = _stream_example()
    shown = _shown_output(block.code)
    assert len(shown) == 4 and "'s-7'" in shown[-1], shown
    pid = triton.process.pid
    # Twice: a stream that ended may be started again under the same string id, as a caller rerunning it would.
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", for_server(block.code, triton)], cwd=ROOT, env=dict(os.environ),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.splitlines() == shown, done.stdout
    assert triton.process.pid == pid and triton.process.poll() is None
