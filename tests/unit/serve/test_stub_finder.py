"""StubFinder against real processes: this test process plays the server, its threads fork stand-in stubs (a
Python named like the stub binary, with a stub's command line)."""
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from s2t.serve import supervisor
from s2t.serve.stub_command import STUB_BINARY
from s2t.serve.supervisor import StubFinder, StubSupervisor, stubs_of
from tests.unit.fake_clock import Clock


class ForkingThread:
    """A thread that starts stand-in stubs on request and stays alive (a thread's children are listed under it)."""

    def __init__(self, binary):
        self.binary = binary
        self.children: list[subprocess.Popen] = []
        self._asks: list[tuple[str, threading.Event]] = []
        self._wake = threading.Condition()
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            with self._wake:
                while not self._asks and not self._stop:
                    self._wake.wait()
                if self._stop:
                    return
                model, done = self._asks.pop()
            # argv: STUB MODEL_FILE SHM SIZE GROWTH PARENT BACKEND_DIR IPC INSTANCE
            self.children.append(subprocess.Popen(
                [self.binary, "-c", "import time; time.sleep(60)", "1", "1", str(os.getpid()), "/b", "1",
                 f"{model}_0_0"], executable=sys.executable))
            done.set()

    def start_stub(self, model: str) -> int:
        done = threading.Event()
        with self._wake:
            self._asks.append((model, done))
            self._wake.notify()
        assert done.wait(10)
        pid = self.children[-1].pid
        # Popen returns once the exec has begun (vfork): for a moment the new command line may still read empty.
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.001)
        return pid

    def stop(self):
        for child in self.children:
            child.kill()
            child.wait()
        with self._wake:
            self._stop = True
            self._wake.notify()
        self.thread.join(5)


@pytest.fixture
def forking(tmp_path):
    binary = str(tmp_path / STUB_BINARY)
    threads = [ForkingThread(binary), ForkingThread(binary)]
    yield threads
    for thread in threads:
        thread.stop()


@pytest.fixture
def thread_reads(monkeypatch):
    """How many threads each look read the children of (None: all of them)."""
    reads = []
    real = supervisor._children_by_thread

    def counted(server_pid, threads):
        reads.append(None if threads is None else len(threads))
        return real(server_pid, threads)
    monkeypatch.setattr(supervisor, "_children_by_thread", counted)
    return reads


def test_a_look_reads_only_the_threads_that_fork_stubs(forking, thread_reads):
    first = forking[0].start_stub("risk_scorer")
    every_stub = set(stubs_of(os.getpid()))
    thread_reads.clear()
    finder = StubFinder(os.getpid(), full_look_seconds=2.0, clock=Clock())
    known = finder.find({})
    assert first in known and set(known) == every_stub
    for _ in range(5):
        known = finder.find(known)
        assert first in known
    assert thread_reads == [None, 1, 1, 1, 1, 1], "one full look, then only the forking thread"


def first_look(forking, full_look_seconds):
    """A stub of the first thread, and a finder (on a clock of its own) that has looked once."""
    clock = Clock()
    first = forking[0].start_stub("risk_scorer")
    finder = StubFinder(os.getpid(), full_look_seconds=full_look_seconds, clock=clock)
    return clock, first, finder, finder.find({})


def test_a_stub_forked_by_another_thread_is_found_by_the_next_full_look(forking, thread_reads):
    clock, first, finder, known = first_look(forking, 2.0)
    second = forking[1].start_stub("skill_adapter")
    clock.now += 1.9
    known = finder.find(known)
    assert second not in known, "within the full-look interval only the known forking threads are read"
    clock.now += 0.2
    known = finder.find(known)
    assert {first, second} <= set(known) and known[second].model == ""  # "-c"'s folder names no model
    assert thread_reads[-1] is None


def test_a_known_stub_gone_makes_the_next_look_full_and_finds_its_replacement(forking, thread_reads):
    _, old, finder, known = first_look(forking, 60.0)
    replacement = forking[1].start_stub("risk_scorer")
    forking[0].children[-1].kill()
    forking[0].children[-1].wait()
    deadline = time.monotonic() + 10
    while old in stubs_of(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    thread_reads.clear()
    known = finder.find(known)
    assert old not in known and replacement in known, "a reload's new stub is seen on the look that misses the old"
    assert thread_reads == [1, None]


def test_a_stub_one_full_look_missed_is_looked_for_again_and_not_taken_for_dead(forking, monkeypatch):
    """A full look that misses a stub (a thread's children file read while the server's threads come and go) must
    not leave the next looks reading only the threads it saw: the stub would stay missing until judged dead."""
    pid = forking[0].start_stub("risk_scorer")
    watcher = StubSupervisor(os.getpid(), "localhost:1", explicit=False, log=lambda message: None)
    watcher._is_ready = lambda model, version: True
    healed = []
    watcher._heal = lambda model, reason, stub: healed.append((model, reason)) or []
    watcher._look()
    watcher._watch.update(watcher._stubs, watcher._is_ready, 0.0)
    assert pid in watcher._stubs
    real, misses = supervisor._children_by_thread, [True]

    def one_blind_full_look(server_pid, threads):
        if threads is None and misses:
            misses.pop()
            return {}
        return real(server_pid, threads)
    monkeypatch.setattr(supervisor, "_children_by_thread", one_blind_full_look)
    watcher._finder._last_full_look = float("-inf")
    for _ in range(2 * supervisor.MISSING_CHECKS):
        watcher.check()
    assert healed == [] and pid in watcher._stubs and not misses
