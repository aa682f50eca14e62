"""The one way files are written for other readers: whole or not at all, readable by others, nothing left behind."""
import os
import stat
import threading

import pytest

from s2t.atomic_files import write_atomically


def test_the_file_holds_the_new_content_readable_by_others_and_no_staged_file_stays(tmp_path):
    path = tmp_path / "models" / "config.pbtxt"
    write_atomically(path, "old\n")
    write_atomically(path, b"new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.pbtxt"]


def test_staging_elsewhere_leaves_the_watched_folder_with_the_file_only(tmp_path):
    watched, staging = tmp_path / "model", tmp_path / ".staging"
    write_atomically(watched / "config.pbtxt", "x", staging_dir=staging)
    assert [p.name for p in watched.iterdir()] == ["config.pbtxt"] and list(staging.iterdir()) == []


def test_a_failed_write_keeps_the_old_file_and_removes_what_was_staged(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_atomically(path, "old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_reader_never_sees_a_partial_file_while_writers_race(tmp_path):
    path = tmp_path / "report.json"
    contents = [str(i) * 100_000 for i in range(4)]
    write_atomically(path, contents[0])
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(20):
        for content in contents:
            write_atomically(path, content)
    stop.set()
    reader.join()
    assert seen <= set(contents)
