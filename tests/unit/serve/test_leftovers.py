"""s2t/serve/leftovers.py: a stub or a shared-memory region is removed only when its owner is gone."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from s2t.serve.leftovers import Holders, Region, orphaned, remove_orphaned_regions, serves_from, stub_is_orphaned
from s2t.serve.stub_command import parse

ME = os.getuid()
NAME = "triton_python_backend_shm_region_1"


@pytest.mark.parametrize("region, holders, expected", [
    (Region(NAME, 1000, 0o600, 7), Holders(frozenset(), frozenset()), True),
    # Mapped or open in some process: in use.
    (Region(NAME, 1000, 0o600, 7), Holders(frozenset({NAME}), frozenset()), False),
    # An unreadable process that could have opened it: root, its owner, anyone when the mode lets them.
    (Region(NAME, 1000, 0o600, 7), Holders(frozenset(), frozenset({0})), False),
    (Region(NAME, 1000, 0o600, 7), Holders(frozenset(), frozenset({1000})), False),
    (Region(NAME, 1000, 0o666, 7), Holders(frozenset(), frozenset({2000})), False),
    # One that could not have: it does not count.
    (Region(NAME, 1000, 0o600, 7), Holders(frozenset(), frozenset({2000})), True),
])
def test_a_region_is_orphaned_only_when_nothing_can_hold_it(region, holders, expected):
    assert orphaned(region, holders) is expected


STUB = ["/b/python/triton_python_backend_stub", "/m/risk_stream/1/model.py", NAME, "1048576", "1048576", "4242",
        "/b/python", "336", "risk_stream_0_0", "DEFAULT"]


@pytest.mark.parametrize("argv, parent, expected", [
    (STUB, 4242, False),
    # Its server died: the kernel gave it to init, or to a subreaper.
    (STUB, 1, True),
    (STUB, 77, True),
    # A command line that stops before the server's pid, or whose pid is not one: never ended.
    (STUB[:4], 1, False),
    ([*STUB[:5], "not-a-pid", *STUB[6:]], 1, False),
])
def test_a_stub_is_orphaned_when_its_server_is_no_longer_its_parent(argv, parent, expected):
    assert stub_is_orphaned(parse(argv), parent) is expected


@pytest.mark.parametrize("repositories, expected", [
    ([Path("/m")], True),
    ([Path("/other"), Path("/m/risk_stream")], True),
    # Another service's repository on the same host: not ours to end.
    ([Path("/mm"), Path("/other")], False),
    ([], False),
])
def test_only_stubs_of_the_repositories_being_served_are_ours(repositories, expected):
    assert serves_from(parse(STUB), repositories) is expected


def test_regions_mapped_or_open_in_a_live_process_stay_and_the_others_go(tmp_path: Path):
    """Against this machine's real /proc: this test process holds two regions, one mapped, one open. However old."""
    names = [f"triton_python_backend_shm_region_{n}" for n in ("mapped", "open", "orphan")]
    names.append("triton_onnxruntime_backend_shm_region_orphan")
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 4096)
    (tmp_path / "someone_elses_file").write_bytes(b"x")
    with open(tmp_path / names[0], "r+b") as mapped_file:
        mapping = mmap.mmap(mapped_file.fileno(), 4096)
    held_open = open(tmp_path / names[1], "rb")
    try:
        # The pause between the two looks is another test's claim (a region mapped meanwhile stays).
        removed = remove_orphaned_regions(tmp_path, Path("/proc"), confirm_after_s=0)
        assert sorted(removed) == sorted(names[2:])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names[:2], "someone_elses_file"])
        # Nothing held any more: the next look removes them.
        mapping.close()
        held_open.close()
        assert sorted(remove_orphaned_regions(tmp_path, Path("/proc"), confirm_after_s=0)) == sorted(names[:2])
    finally:
        if not mapping.closed:
            mapping.close()
        held_open.close()


def _fake_process(proc: Path, pid: int, maps: str = "") -> Path:
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "maps").write_text(maps)
    return proc / str(pid)


def test_a_region_a_server_maps_between_the_two_looks_stays(tmp_path, monkeypatch):
    from s2t.serve import leftovers
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    (shm / NAME).write_bytes(b"\0" * 16)
    (shm / "triton_python_backend_shm_region_2").write_bytes(b"\0" * 16)
    server = _fake_process(proc, 100)
    mapping = f"7f00-7f01 rw-s 00000000 00:1a 42                         {shm.resolve()}/{NAME}\n"
    # The server maps the first region while the clean-up waits for its second look.
    monkeypatch.setattr(leftovers.time, "sleep", lambda seconds: (server / "maps").write_text(mapping))
    assert remove_orphaned_regions(shm, proc) == ["triton_python_backend_shm_region_2"]
    assert (shm / NAME).exists()
