"""s2t/serve/leftovers.py returns within seconds whatever state the processes are in: a process whose /proc files
never answer (as a read of maps or cmdline waits on a process stuck holding its memory-map lock) is given up and
skipped, and a zombie is dead for every purpose. The stuck reads are FIFOs nobody writes to, in a /proc made for
the test; the zombies are real."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from s2t.serve import leftovers

ME = os.getuid()
REGION = "triton_python_backend_shm_region_left"
READ_TIMEOUT_S = 0.5


@pytest.fixture(autouse=True)
def quick_and_forgetful(monkeypatch):
    """Short timeouts, and no process remembered as stuck from one test to the next."""
    monkeypatch.setattr(leftovers, "PROC_READ_TIMEOUT_S", READ_TIMEOUT_S)
    monkeypatch.setattr(leftovers, "PROC_WALK_DEADLINE_S", 3.0)
    monkeypatch.setattr(leftovers, "_stuck", {})


@pytest.fixture
def fifos():
    """FIFOs made by the test; each is opened for writing and closed at the end, so that a reader still blocked on
    one returns and its thread ends."""
    made: list[Path] = []
    yield made
    for fifo in made:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # nobody is reading it
        os.close(fd)


def fake_process(proc: Path, pid: int, comm: str, *, maps: str = "", cmdline: list[str] | None = None,
                 parent: int = 1, state: str = "S", stuck: str | None = None, fifos: list[Path] | None = None) -> Path:
    folder = proc / str(pid)
    (folder / "fd").mkdir(parents=True)
    (folder / "comm").write_text(comm + "\n")
    (folder / "stat").write_text(f"{pid} ({comm}) {state} {parent} {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 20 0 1 0 "
                                 f"{1000 + pid} 0 0\n")
    (folder / "maps").write_text(maps)
    (folder / "cmdline").write_bytes("\0".join(cmdline or [comm]).encode() + b"\0")
    if stuck is not None:
        (folder / stuck).unlink()
        os.mkfifo(folder / stuck)
        fifos.append(folder / stuck)
    return folder


def shm_with(tmp_path: Path, *names: str) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    for name in names:
        (shm / name).write_bytes(b"\0" * 16)
    return shm


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_a_triton_process_whose_maps_never_answer_is_given_up_and_a_region_it_could_hold_stays(tmp_path, fifos):
    shm = shm_with(tmp_path, REGION)
    proc = tmp_path / "proc"
    fake_process(proc, 200, "tritonserver", stuck="maps", fifos=fifos)
    removed, seconds = timed(lambda: leftovers.remove_orphaned_regions(shm, proc, confirm_after_s=0))
    assert removed == [] and (shm / REGION).exists()
    assert seconds < READ_TIMEOUT_S + 1.0, seconds
    # Known stuck from now on: the next look skips it at once instead of waiting on it again.
    removed, seconds = timed(lambda: leftovers.remove_orphaned_regions(shm, proc, confirm_after_s=0))
    assert removed == [] and seconds < READ_TIMEOUT_S, seconds


def test_a_stuck_process_of_another_program_keeps_no_region_and_the_walk_goes_on_past_it(tmp_path, fifos):
    held = "triton_python_backend_shm_region_held"
    shm = shm_with(tmp_path, REGION, held)
    proc = tmp_path / "proc"
    fake_process(proc, 200, "sh", stuck="maps", fifos=fifos)
    # After the stuck one: a stub that maps `held` is still read.
    fake_process(proc, 300, "triton_python_b", maps=f"7f00-7f01 rw-s 0 00:1a 42  {shm.resolve()}/{held}\n")
    removed, seconds = timed(lambda: leftovers.remove_orphaned_regions(shm, proc, confirm_after_s=0))
    assert removed == [REGION] and (shm / held).exists()
    assert seconds < 2 * READ_TIMEOUT_S + 1.0, seconds


def test_a_process_whose_command_line_never_answers_costs_the_stub_kill_a_bounded_wait(tmp_path, fifos):
    proc = tmp_path / "proc"
    for pid in (200, 201, 202):
        fake_process(proc, pid, "triton_python_b", stuck="cmdline", fifos=fifos)
    killed, seconds = timed(lambda: leftovers.kill_orphaned_stubs([tmp_path], proc))
    assert killed == []
    assert seconds < 3 * READ_TIMEOUT_S + 1.0, seconds


def test_a_walk_past_its_deadline_judges_no_region_unheld(tmp_path, fifos, monkeypatch):
    monkeypatch.setattr(leftovers, "PROC_WALK_DEADLINE_S", 0.8)
    shm = shm_with(tmp_path, REGION)
    proc = tmp_path / "proc"
    for pid in range(200, 210):
        fake_process(proc, pid, "sh", stuck="maps", fifos=fifos)
    holders, seconds = timed(lambda: leftovers.holders(shm, proc))
    assert not holders.complete and seconds < 2.0, seconds
    assert leftovers.remove_orphaned_regions(shm, proc, confirm_after_s=0) == [] and (shm / REGION).exists()


def test_clean_returns_within_seconds_with_stuck_processes_and_zombies_about(tmp_path, fifos):
    shm = shm_with(tmp_path, REGION)
    proc = tmp_path / "proc"
    fake_process(proc, 200, "triton_python_b", stuck="cmdline", fifos=fifos)
    fake_process(proc, 201, "triton_python_b", state="Z", stuck="maps", fifos=fifos)
    fake_process(proc, 202, "sh", stuck="maps", fifos=fifos)
    (stubs, removed), seconds = timed(lambda: leftovers.clean([tmp_path], shm, proc))
    # The zombie's maps are never read (a zombie maps nothing); the others are given up once each, and the stub
    # whose files never answered could hold the region, which stays.
    assert stubs == [] and removed == [] and (shm / REGION).exists()
    assert seconds < 2 * READ_TIMEOUT_S + leftovers.CONFIRM_AFTER_S + 1.0, seconds


@pytest.fixture
def zombie():
    """A real zombie: a child of this process that exited and that nobody has waited for yet."""
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    deadline = time.monotonic() + 10
    while not leftovers.dead(Path(f"/proc/{pid}")) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield pid
    os.waitpid(pid, 0)


def test_a_zombie_is_dead_and_no_member_of_its_group_and_nothing_waits_on_it(zombie):
    stat = leftovers.read_stat(Path(f"/proc/{zombie}"))
    assert stat is not None and stat.state == "Z", "the zombie is still there, unreaped"
    assert leftovers.dead(Path(f"/proc/{zombie}"))
    assert zombie not in leftovers.group_members(stat.group)
    assert timed(lambda: leftovers.wait_dead([zombie], timeout_s=5))[1] < 0.5
    visited = []
    leftovers.walk(Path("/proc"), lambda pid_dir, _stat: visited.append(int(pid_dir.name)))
    assert zombie not in visited and os.getpid() in visited


def test_a_stopped_process_is_alive_and_a_killed_one_is_dead_once_it_exits():
    process = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(process.pid, 19)  # SIGSTOP: stuck, not dead
        assert not leftovers.dead(Path(f"/proc/{process.pid}"))
        assert not leftovers.wait_dead([process.pid], timeout_s=0.3)
        process.kill()  # SIGKILL ends a stopped process too
        assert leftovers.wait_dead([process.pid], timeout_s=5)
    finally:
        process.kill()
        process.wait()


def test_walks_that_run_at_once_from_several_threads_each_see_every_process(tmp_path):
    proc = tmp_path / "proc"
    for pid in range(200, 240):
        fake_process(proc, pid, "sh")
    seen: list[list[int]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=leftovers.walk, args=(proc, lambda d, _s, k=k: seen[k].append(int(d.name))))
               for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert all(sorted(s) == list(range(200, 240)) for s in seen)


def test_a_start_waits_on_a_slow_clean_up_no_longer_than_its_bound_and_the_clean_up_goes_on(tmp_path, fifos,
                                                                                             monkeypatch):
    monkeypatch.setattr(leftovers, "PROC_READ_TIMEOUT_S", 1.0)
    shm = shm_with(tmp_path, REGION)
    proc = tmp_path / "proc"
    fake_process(proc, 200, "sh", stuck="maps", fifos=fifos)
    outcome, seconds = timed(lambda: leftovers.clean_within([tmp_path], 0.3, shm, proc))
    assert outcome is None and seconds < 1.0, seconds
    # Meanwhile the clean-up gives the stuck process up and removes the region nobody holds.
    assert wait_for(lambda: not (shm / REGION).exists(), 5)
    assert leftovers.clean_within([tmp_path], 5, shm, proc) == ([], [])


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()
