"""The memory a soak watches: a process's resident pages less those backed by files (RssAnon + RssShmem of
/proc/PID/status), so that the kernel dropping clean library and model-file pages under memory pressure, which makes
plain RSS fall, is not read as memory given back, and reading them back in is not read as growth."""
from __future__ import annotations

from pathlib import Path

import psutil

PROC = Path("/proc")


def owned_bytes(pid: int) -> int:
    """RssAnon + RssShmem of `pid` in bytes (plain RSS where /proc does not say them); psutil.NoSuchProcess once
    the process is gone."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("RssAnon", "RssShmem"):
            fields[name] = int(value.split()[0]) * 1024
    if len(fields) < 2:
        return psutil.Process(pid).memory_info().rss
    return fields["RssAnon"] + fields["RssShmem"]


def tree_owned_bytes(root: int) -> int:
    """owned_bytes summed over `root` and its living descendants."""
    processes = [psutil.Process(root)] + psutil.Process(root).children(recursive=True)
    total = 0
    for proc in processes:
        try:
            total += owned_bytes(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return total
