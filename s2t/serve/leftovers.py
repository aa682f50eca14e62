"""What a tritonserver that did not exit cleanly leaves behind, found by its owner and removed.

Each python (and Python-based) backend instance has a stub process and a shared-memory region
`/dev/shm/triton_<backend>_backend_shm_region_<uuid>` (1 MB and more) that the server unlinks when it unloads the
model. A server killed with SIGKILL, or crashing, unlinks nothing, and a stub busy in its own threads can live on
without its server. So:

- a stub is orphaned when the server pid it was started with (its 5th argument) is no longer its parent: the
  kernel hands a stub whose server died to init (or a subreaper), never back. Only stubs serving a model of the
  repositories being started are this service's to end (another service on the host has its own);
- a region is orphaned when no process maps it or holds it open (/proc/*/maps, /proc/*/fd), in two looks half a
  second apart: a server maps a region within microseconds of creating it, so a region in the middle of being
  created is held by the second look. Its age says nothing (a region in use is written all the time; one left
  by a crash can be a second old).

A zombie (state Z in /proc/PID/stat) is dead for every purpose here: it maps nothing, holds no file, runs nothing,
and may never be reaped (an init that reaps nobody, as in many containers). Every wait is bounded: a read of
/proc/PID/maps or /proc/PID/cmdline waits for that process's memory-map lock, which a process stuck in the kernel
can hold for good, so each walk of /proc reads in a thread of its own and gives a process up after
PROC_READ_TIMEOUT_S; a region that process could hold then stays (PROC_RETRY_S later it is read again).

Standard library only (the keeper runs this on the NGC image's Python).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from s2t.serve import stub_command
from s2t.serve.stub_command import PROC, SHM_DIR, StubCommand

REGION_GLOB = "triton_*_backend_shm_region_*"
# `tritonserver` and `triton_python_backend_stub` as /proc/PID/comm shows them (15 characters at most).
TRITON_COMM_PREFIX = "triton"
# Between the two looks at a region nobody held.
CONFIRM_AFTER_S = 0.5
# How long killed processes may take to be gone: SIGKILL ends a process within milliseconds unless it is stuck in
# the kernel, and one that is holds only its own region, which a later clean-up removes. A new server never waits
# on the old one's processes longer than this.
GROUP_GONE_TIMEOUT_S = 3.0
# One read of one process's /proc files; past it the process is taken as stuck (a walk of every process reads in
# milliseconds, under load in tens of them).
PROC_READ_TIMEOUT_S = 2.0
# A walk of /proc given up past this, whatever it read: what it could not judge is left for a later clean-up.
PROC_WALK_DEADLINE_S = 6.0
# A process given up as stuck is read again after this long.
PROC_RETRY_S = 30.0
# How long a server's start waits on a clean-up (clean_within); one still running goes on without it.
CLEAN_WAIT_S = 3.0
DEAD_STATES = frozenset("ZX")


@dataclass(frozen=True)
class Region:
    name: str
    uid: int
    mode: int
    inode: int


@dataclass(frozen=True)
class Holders:
    """What the processes of this machine have open: region names held, and the uids of Triton processes whose maps
    and fds could not be read (another user's, or stuck; one that exited while being read does not count).
    Incomplete: the walk was given up, so nothing can be judged unheld."""

    held: frozenset[str]
    unreadable_uids: frozenset[int]
    complete: bool = True


@dataclass(frozen=True)
class ProcStat:
    state: str
    parent: int
    group: int
    # Clock ticks after boot: with the pid, one process (a pid is reused, never with the same start).
    started: str


def orphaned(region: Region, holders: Holders) -> bool:
    """True when nothing can be using `region`: no readable process holds it, and no unreadable process could
    have opened it (root can open anything; its owner can; anyone else only through group/other permission bits)."""
    if not holders.complete or region.name in holders.held:
        return False
    for uid in holders.unreadable_uids:
        if uid == 0 or uid == region.uid or region.mode & 0o066:
            return False
    return True


def regions_of(pids) -> set[str]:
    """The regions of these stub processes (those still running)."""
    commands = (stub_command.read(pid, PROC) for pid in pids)
    return {command.region for command in commands if command is not None and command.region}


def stub_is_orphaned(command: StubCommand, parent_pid: int) -> bool:
    return command.server_pid is not None and command.server_pid != parent_pid


def serves_from(command: StubCommand, repositories: list[Path]) -> bool:
    """Whether the stub's model file lies in one of `repositories` (resolved paths)."""
    return any(command.model_file.is_relative_to(repository) for repository in repositories)


def _process_dirs(proc: Path):
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield entry


def read_stat(pid_dir: Path) -> ProcStat | None:
    """None when the process is gone. /proc/PID/stat never waits on the process's memory-map lock."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
        return ProcStat(fields[0], int(fields[1]), int(fields[2]), fields[19])
    except (OSError, IndexError, ValueError):
        return None


def dead(pid_dir: Path) -> bool:
    """Gone, or a zombie that nobody may ever reap."""
    stat = read_stat(pid_dir)
    return stat is None or stat.state in DEAD_STATES


def _fd_targets(fd_dir: Path) -> list[str]:
    targets = []
    for fd in fd_dir.iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:
            continue  # closed meanwhile (the listing's own descriptor, in this very process)
    return targets


# Processes whose reads did not return: pid -> (start, when given up). Skipped until PROC_RETRY_S has passed.
_stuck: dict[int, tuple[str | None, float]] = {}
_stuck_lock = threading.Lock()


def _known_stuck(pid: int, started: str | None, now: float) -> bool:
    with _stuck_lock:
        entry = _stuck.get(pid)
        if entry is None:
            return False
        if (entry[0] is not None and entry[0] != started) or now - entry[1] >= PROC_RETRY_S:
            del _stuck[pid]  # another process with a reused pid, or time to read it again
            return False
        return True


def _give_up(pid: int, started: str | None, now: float) -> None:
    with _stuck_lock:
        _stuck[pid] = (started, now)


class _Walker(threading.Thread):
    """Visits processes one after another in its own thread; `at` says which one it is reading and since when."""

    def __init__(self, pid_dirs: list[Path], visit: Callable[[Path, ProcStat | None], None],
                 skip: Callable[[Path], None]):
        super().__init__(name="s2t-proc-walk", daemon=True)
        self.pid_dirs, self.visit, self.skip = pid_dirs, visit, skip
        self.at: tuple[int, str | None, float] = (-1, None, time.monotonic())
        self.abandoned = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for index, pid_dir in enumerate(self.pid_dirs):
                if self.abandoned:
                    return
                self.at = (index, None, time.monotonic())
                stat = read_stat(pid_dir)
                if stat is not None and stat.state in DEAD_STATES:
                    continue
                started = stat.started if stat is not None else None
                if _known_stuck(int(pid_dir.name), started, time.monotonic()):
                    self.skip(pid_dir)
                    continue
                self.at = (index, started, time.monotonic())
                self.visit(pid_dir, stat)
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            self.error = err


def walk(proc: Path, visit: Callable[[Path, ProcStat | None], None],
         skip: Callable[[Path], None] = lambda pid_dir: None, read_timeout_s: float | None = None,
         deadline_s: float | None = None) -> bool:
    """`visit(pid_dir, stat)` for every live process of `proc` (zombies left out; `stat` None when it could not be
    read: the process is gone, or was meanwhile), `skip(pid_dir)` for each one given up as stuck. True when every
    process was visited or skipped; False when the walk ran past `deadline_s`. A visit that never returns is left
    to its thread: the walk goes on with the next process in a new one."""
    read_timeout_s = PROC_READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
    deadline_s = PROC_WALK_DEADLINE_S if deadline_s is None else deadline_s
    pid_dirs = sorted(_process_dirs(proc), key=lambda d: int(d.name))
    started = time.monotonic()
    while True:
        walker = _Walker(pid_dirs, visit, skip)
        walker.start()
        while walker.is_alive():
            walker.join(0.02)
            index, process_start, since = walker.at
            now = time.monotonic()
            # Index -1: the thread has not begun (a loaded machine), which is no stuck read.
            if walker.is_alive() and ((index >= 0 and now - since > read_timeout_s) or now - started > deadline_s):
                break
        if not walker.is_alive():
            if walker.error is not None:
                raise walker.error
            return True
        walker.abandoned = True
        if time.monotonic() - started > deadline_s:
            return False
        _give_up(int(pid_dirs[index].name), process_start, time.monotonic())
        skip(pid_dirs[index])
        pid_dirs = pid_dirs[index + 1:]


def holders(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> Holders:
    prefix = f"{shm_dir.resolve()}/"
    held, unreadable = set(), set()

    def unreadable_if_triton(pid_dir: Path) -> None:
        try:
            # Only Triton's own processes (server and stubs) create or map these regions; an unreadable
            # process of another program (a container's init, another user's shell) cannot be holding one.
            if (pid_dir / "comm").read_text().startswith(TRITON_COMM_PREFIX):
                unreadable.add(pid_dir.stat().st_uid)
        except OSError:
            pass

    def visit(pid_dir: Path, _stat: ProcStat | None) -> None:
        try:
            maps = (pid_dir / "maps").read_text(errors="replace")
            fds = _fd_targets(pid_dir / "fd")
        except PermissionError:
            unreadable_if_triton(pid_dir)
            return
        except OSError:
            return  # exited while being read
        found = set()
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            path = fields[5] if len(fields) == 6 else ""
            if path.startswith(prefix):
                found.add(path[len(prefix):].removesuffix(" (deleted)"))
        found.update(target[len(prefix):] for target in fds if target.startswith(prefix))
        held.update(found)

    complete = walk(proc, visit, unreadable_if_triton)
    return Holders(frozenset(held), frozenset(unreadable), complete)


def regions(shm_dir: Path = SHM_DIR) -> list[Region]:
    found = []
    for path in shm_dir.glob(REGION_GLOB):
        try:
            st = path.stat()
        except OSError:
            continue
        found.append(Region(path.name, st.st_uid, st.st_mode & 0o777, st.st_ino))
    return found


def kill_orphaned_stubs(repositories, proc: Path = PROC) -> list[int]:
    """SIGKILL every python backend stub of `repositories` whose server is gone (stopped ones included: SIGKILL
    ends a stopped process too). One whose command line cannot be read in time is left alone."""
    repositories = [Path(r).resolve() for r in repositories]
    killed = []

    def visit(pid_dir: Path, stat: ProcStat | None) -> None:
        command = stub_command.read(int(pid_dir.name), proc)
        if stat is None or command is None or not serves_from(command, repositories) \
                or not stub_is_orphaned(command, stat.parent):
            return
        try:
            os.kill(int(pid_dir.name), signal.SIGKILL)
        except OSError:
            return
        killed.append(int(pid_dir.name))

    walk(proc, visit)
    return list(killed)


def remove_orphaned_regions(shm_dir: Path = SHM_DIR, proc: Path = PROC,
                            confirm_after_s: float = CONFIRM_AFTER_S) -> list[str]:
    first = holders(shm_dir, proc)
    candidates = {r for r in regions(shm_dir) if orphaned(r, first)}
    if not candidates:
        return []
    time.sleep(confirm_after_s)
    second = holders(shm_dir, proc)
    removed = []
    # The same file (inode) unheld both times; a name reused meanwhile is a new region.
    for region in candidates & set(regions(shm_dir)):
        if orphaned(region, second):
            try:
                (shm_dir / region.name).unlink()
                removed.append(region.name)
            except OSError:
                continue
    return removed


def group_members(pgid: int, proc: Path = PROC) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for pid_dir in _process_dirs(proc):
        stat = read_stat(pid_dir)
        if stat is not None and stat.group == pgid and stat.state not in DEAD_STATES:
            members.append(int(pid_dir.name))
    return members


def wait_group_gone(pgid: int, timeout_s: float | None = None, proc: Path = PROC) -> bool:
    deadline = time.monotonic() + (GROUP_GONE_TIMEOUT_S if timeout_s is None else timeout_s)
    while group_members(pgid, proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_dead(pids, timeout_s: float | None = None, proc: Path = PROC) -> bool:
    """Whether every one of `pids` is gone or a zombie within `timeout_s` (GROUP_GONE_TIMEOUT_S)."""
    deadline = time.monotonic() + (GROUP_GONE_TIMEOUT_S if timeout_s is None else timeout_s)
    while not all(dead(proc / str(pid)) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def clean(repositories, shm_dir: Path = SHM_DIR, proc: Path = PROC) -> tuple[list[int], list[str]]:
    """The orphaned stubs of `repositories` killed (and waited for, a bounded while), then every orphaned region
    removed: (stub pids, region names). Returns within seconds whatever state the processes are in."""
    stubs = kill_orphaned_stubs(repositories, proc)
    wait_dead(stubs, proc=proc)
    return stubs, remove_orphaned_regions(shm_dir, proc)


def clean_within(repositories, timeout_s: float | None = None, shm_dir: Path = SHM_DIR,
                 proc: Path = PROC) -> tuple[list[int], list[str]] | None:
    """clean() in a thread of its own, waited for `timeout_s` (CLEAN_WAIT_S) at most: what it did, or None while
    it goes on. Nothing a new server needs waits on it (its stubs make regions of their own, and an orphaned stub
    holds none of its descriptors); it frees memory, and a clean-up that runs on beside a starting server takes
    nothing of it (a region is judged in two looks, a stub by its parent)."""
    done: list[tuple[list[int], list[str]]] = []
    worker = threading.Thread(target=lambda: done.append(clean(repositories, shm_dir, proc)),
                              name="s2t-leftovers-clean", daemon=True)
    worker.start()
    worker.join(CLEAN_WAIT_S if timeout_s is None else timeout_s)
    return done[0] if done else None
