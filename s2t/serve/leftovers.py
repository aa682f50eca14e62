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

Standard library only (the keeper runs this on the NGC image's Python).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from s2t.serve import stub_command
from s2t.serve.stub_command import PROC, SHM_DIR, StubCommand

REGION_GLOB = "triton_*_backend_shm_region_*"
# `tritonserver` and `triton_python_backend_stub` as /proc/PID/comm shows them (15 characters at most).
TRITON_COMM_PREFIX = "triton"
# Between the two looks at a region nobody held.
CONFIRM_AFTER_S = 0.5
# How long a reaped process group may take to be gone (SIGKILL is asynchronous).
GROUP_GONE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Region:
    name: str
    uid: int
    mode: int
    inode: int


@dataclass(frozen=True)
class Holders:
    """What the processes of this machine have open: region names held, and the uids of Triton processes whose maps
    and fds could not be read (another user's; one that exited while being read does not count)."""

    held: frozenset[str]
    unreadable_uids: frozenset[int]


def orphaned(region: Region, holders: Holders) -> bool:
    """True when nothing can be using `region`: no readable process holds it, and no unreadable process could
    have opened it (root can open anything; its owner can; anyone else only through group/other permission bits)."""
    if region.name in holders.held:
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


def _parent_pid(stat_text: str) -> int:
    return int(stat_text.rsplit(")", 1)[1].split()[1])


def _fd_targets(fd_dir: Path) -> list[str]:
    targets = []
    for fd in fd_dir.iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:
            continue  # closed meanwhile (the listing's own descriptor, in this very process)
    return targets


def holders(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> Holders:
    prefix = f"{shm_dir.resolve()}/"
    held, unreadable = set(), set()
    for pid_dir in _process_dirs(proc):
        try:
            maps = (pid_dir / "maps").read_text(errors="replace")
            fds = _fd_targets(pid_dir / "fd")
        except PermissionError:
            try:
                # Only Triton's own processes (server and stubs) create or map these regions; an unreadable
                # process of another program (a container's init, another user's shell) cannot be holding one.
                if (pid_dir / "comm").read_text().startswith(TRITON_COMM_PREFIX):
                    unreadable.add(pid_dir.stat().st_uid)
            except OSError:
                pass
            continue
        except OSError:
            continue  # exited while being read
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            path = fields[5] if len(fields) == 6 else ""
            if path.startswith(prefix):
                held.add(path[len(prefix):].removesuffix(" (deleted)"))
        held.update(target[len(prefix):] for target in fds if target.startswith(prefix))
    return Holders(frozenset(held), frozenset(unreadable))


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
    """SIGKILL every python backend stub of `repositories` whose server is gone."""
    repositories = [Path(r).resolve() for r in repositories]
    killed = []
    for pid_dir in _process_dirs(proc):
        try:
            command = stub_command.read(int(pid_dir.name), proc)
            if command is None:
                continue
            parent = _parent_pid((pid_dir / "stat").read_text())
            if serves_from(command, repositories) and stub_is_orphaned(command, parent):
                os.kill(int(pid_dir.name), signal.SIGKILL)
                killed.append(int(pid_dir.name))
        except (OSError, ValueError, IndexError):
            continue
    return killed


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
        try:
            fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(pid_dir.name))
    return members


def wait_group_gone(pgid: int, timeout_s: float = GROUP_GONE_TIMEOUT_S, proc: Path = PROC) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid, proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def clean(repositories, shm_dir: Path = SHM_DIR, proc: Path = PROC) -> tuple[list[int], list[str]]:
    """The orphaned stubs of `repositories` killed (and waited for), then every orphaned region removed:
    (stub pids, region names)."""
    stubs = kill_orphaned_stubs(repositories, proc)
    deadline = time.monotonic() + GROUP_GONE_TIMEOUT_S
    while any((proc / str(pid)).exists() and not _zombie(proc / str(pid)) for pid in stubs) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return stubs, remove_orphaned_regions(shm_dir, proc)


def _zombie(pid_dir: Path) -> bool:
    try:
        return (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
