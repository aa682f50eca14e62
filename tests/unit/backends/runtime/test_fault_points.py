"""Fault points that do something other than raise (backends/runtime/fault_points.py): read from S2T_FAULT_POINTS
with an
optional share, and each doing to a real process what its name says."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from s2t.backends.runtime import fault_points
from s2t.backends.runtime.fault_points import Action
from tests.conftest import ROOT


@pytest.mark.parametrize("text, points", [
    ("a.b=kill", {"a.b": Action("kill")}),
    ("a.b=segv:0.25, c.d=0.5", {"a.b": Action("segv", 0.25), "c.d": 0.5}),
    ("a=exit:1,b=hang:0", {"a": Action("exit"), "b": Action("hang", 0.0)}),
])
def test_a_kind_is_read_with_its_share(text, points):
    assert fault_points.parse(text) == points


def test_a_kinds_share_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="within 0..1"):
        fault_points.parse("a=segv:1.5")


def test_a_kind_at_a_share_of_0_never_fires(monkeypatch):
    monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse("p=segv:0"))
    for _ in range(100):
        fault_points.check("p")


def at_the_point(kind: str, before: str = "") -> subprocess.Popen:
    """A Python process with faulthandler on (as every model's interpreter runs) that passes point `p` set to
    `kind`, after running `before`."""
    # The line is one write: print writes its text and its newline apart when output is unbuffered
    # (PYTHONUNBUFFERED), and another thread's output between them would hide it.
    code = (f"{before}\nimport os\nfrom s2t.backends.runtime import fault_points\nos.write(1, b'at the point\\n')\n"
            "fault_points.check('p')")
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, fault_points.ENVIRONMENT_VARIABLE: f"p={kind}"})


def test_segv_dies_of_a_real_sigsegv_and_faulthandler_names_the_points_frame():
    process = at_the_point("segv")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in stderr
    assert 'fault_points.py", line' in stderr and "in _segv" in stderr


def test_exit_ends_the_process_at_once_with_its_status():
    process = at_the_point("exit", before="import atexit; atexit.register(print, 'cleaned up')")
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == fault_points.EXIT_STATUS
    assert "cleaned up" not in stdout


def test_hang_holds_the_gil_so_no_other_thread_of_the_interpreter_runs():
    # One write per tick, as for the line that says the point is reached.
    ticker = ("import os, threading, time\n"
              "def tick():\n"
              "    while True:\n"
              "        os.write(1, b'tick\\n')\n"
              "        time.sleep(0.01)\n"
              "threading.Thread(target=tick, daemon=True).start()\n"
              "time.sleep(0.05)")
    process = at_the_point("hang", before=ticker)
    try:
        before = 0
        for line in process.stdout:
            if line.strip() == "at the point":
                break
            before += line.strip() == "tick"
        else:
            pytest.fail(f"the process ended before the point: {process.stderr.read()[-2000:]}")
        assert before >= 1, "the ticker never ran"
        # A hang that let the ticker run would print about 30 ticks meanwhile.
        time.sleep(0.3)
        assert process.poll() is None, "the hang returned or the process died"
    finally:
        process.kill()
    after = process.communicate(timeout=60)[0].split()
    assert len(after) <= 1, f"{len(after)} ticks while the point hung"
