"""Files and folders that readers see whole or not at all, and that survive a crash once written: the one way this
project writes anything another process reads (configs Triton polls, version folders, state and reports)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename into (or out of) `path` durable: the directory entry itself must reach the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_rename(source: Path, target: Path) -> None:
    """One rename, then fsync of the moved folder (or file) and of both parents, so a crash keeps either side."""
    os.rename(source, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(Path(target).parent)
    if Path(source).parent != Path(target).parent:
        fsync_dir(Path(source).parent)


def write_atomically(path: Path, content: str | bytes, staging_dir: Path | None = None) -> None:
    """`path` holds `content`, durably; a reader sees the old file or the new one, never half of one.

    The content is staged in `staging_dir` (same file system; default: beside `path`) so that a folder a server
    watches never shows a partial file, then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(staging_dir) if staging_dir is not None else path.parent
    staging.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=staging)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content.encode() if isinstance(content, str) else content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(staged, 0o644)  # mkstemp's 0600 would hide it from a reader running as another user
        durable_rename(Path(staged), path)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
