"""s2t/serve/keeper.py's OrphanReaper: as a container's PID 1 (or a subreaper) `s2t serve` and the keeper reap the
processes the kernel hands them, and never take the exit status of a child that a Popen of theirs waits for."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from s2t.serve import leftovers
from s2t.serve.keeper import OrphanReaper, children

ROOT = Path(__file__).resolve().parents[3]


def zombie_child() -> int:
    """A child of this process that exited, started without a Popen: nothing here waits for it."""
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    deadline = time.monotonic() + 10
    while leftovers.read_stat(Path(f"/proc/{pid}")).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def test_a_zombie_child_nothing_waits_for_is_reaped_on_the_second_look():
    pid = zombie_child()
    reaper = OrphanReaper()
    assert pid in children()
    assert reaper.reap() == [], "one look is not enough: a Popen may not have set its pid yet"
    assert reaper.reap() == [pid]
    assert pid not in children() and leftovers.read_stat(Path(f"/proc/{pid}")) is None


def test_a_child_a_popen_waits_for_keeps_its_exit_status():
    process = subprocess.Popen(["sh", "-c", "exit 7"])
    deadline = time.monotonic() + 10
    while leftovers.read_stat(Path(f"/proc/{process.pid}")).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    reaper = OrphanReaper()
    for _ in range(3):
        assert process.pid not in reaper.reap()
    assert process.wait(5) == 7


ADOPTING_PROCESS = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    from pathlib import Path
    from s2t.serve.keeper import OrphanReaper, adopts_orphans, children
    from s2t.serve.leftovers import read_stat

    assert not adopts_orphans() or os.getpid() == 1
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    assert adopts_orphans()
    reaper = OrphanReaper(interval_s=0.1)
    reaper.start()
    # The shell exits at once; its three sleeps are orphans the kernel hands to this process.
    subprocess.run(["sh", "-c", "sleep 0.3 & sleep 0.3 & sleep 0.3 & exit 0"], check=True)
    own = subprocess.Popen(["sh", "-c", "sleep 0.5; exit 7"])
    time.sleep(2.0)
    stats = {pid: read_stat(Path(f"/proc/{pid}")) for pid in children() if pid != own.pid}
    zombies = [pid for pid, stat in stats.items() if stat is not None and stat.state == "Z"]
    print(f"reaped={len(reaper.reaped)} zombies={len(zombies)} own={own.wait(5)}", flush=True)
""")


def test_a_subreaper_reaps_the_orphans_it_adopts_and_its_own_popen_keeps_its_status():
    done = subprocess.run([sys.executable, "-c", ADOPTING_PROCESS], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "reaped=3 zombies=0 own=7", done.stdout + done.stderr
