"""s2t/serve/stub_command.py: a python backend stub's model, region, server and instance, from its command line."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from s2t.serve.stub_command import StubCommand, parse, read

BINARY = "/tmp/b/python/triton_python_backend_stub"
STUB = [BINARY, "/repo/risk_scorer/2/model.onnx", "triton_python_backend_shm_region_7", "1048576", "1048576", "4242",
        "/tmp/b/python", "336", "risk_scorer_0_0", "/tmp/b/onnxruntime"]


@pytest.mark.parametrize("argv, expected", [
    (STUB, StubCommand(model_file=Path("/repo/risk_scorer/2/model.onnx"), region="triton_python_backend_shm_region_7",
                       server_pid=4242, instance="risk_scorer_0_0")),
    # A region named with a leading slash (a POSIX shm name) is still the file in /dev/shm.
    ([BINARY, "/m/a/1/model.py", "/region"], StubCommand(model_file=Path("/m/a/1/model.py"), region="region",
                                                         server_pid=None, instance=None)),
    ([*STUB[:5], "not-a-pid"], StubCommand(model_file=Path("/repo/risk_scorer/2/model.onnx"),
                                           region="triton_python_backend_shm_region_7", server_pid=None,
                                           instance=None)),
    (["/usr/bin/python3", "x.py", "y", "z", "w", "4242", "a", "b", "c"], None),
    ([BINARY, "/m/a/1/model.py"], None),
    ([""], None),
])
def test_a_stub_command_line_is_read_field_by_field(argv, expected):
    assert parse(argv) == expected


def test_model_version_and_the_config_completing_stub_come_from_the_model_file_and_instance():
    command = parse(STUB)
    assert (command.model, command.version, command.completes_config) == ("risk_scorer", "2", False)
    assert parse([*STUB[:8], "risk_scorer"]).completes_config


def test_a_process_is_read_from_proc_and_one_that_is_no_stub_or_gone_is_none():
    # A real process whose argv[0] is the stub's: Python, run as `STUB -c CODE SIZE GROWTH SERVER_PID ...`.
    argv = [BINARY, "-c", "import time; time.sleep(60)", "1", "1", str(os.getpid()), "/b", "1", "risk_scorer_0_0"]
    child = subprocess.Popen(argv, executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while read(child.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read(child.pid) == parse(argv)
        assert read(child.pid).server_pid == os.getpid()
        assert read(os.getpid()) is None
    finally:
        child.kill()
        child.wait()
    assert read(child.pid) is None
