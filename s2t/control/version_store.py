"""Version folders of a model repository, and the control area beside it that Triton never polls.

`<repo>/../.<repo-name>.s2t/` holds the staging folders of publishes in progress, the versions retired by a
rollback (kept, so that a roll-forward is one rename back), `history.jsonl` (one line per publish, stage,
canary, promote or rollback: who, when, what, and the parity figures), the rollout state of each model and the
lock that serialises every command changing what is served. Keeping them out of the model folders matters: in
poll mode any write inside a model folder makes Triton reload that model.
"""
from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from s2t.atomic_files import durable_rename
from s2t.backends.runtime.repository_layout import control_folder
from s2t.backends.runtime.repository_layout import version_numbers  # part of this module's interface
from s2t.errors import S2TError

LOCK_TIMEOUT_SECONDS = 300.0


class ControlLockTimeout(S2TError):
    """Another command that changes what is served held the lock for too long."""


@dataclass(frozen=True)
class VersionStore:
    repository: Path

    @property
    def control(self) -> Path:
        return control_folder(self.repository)

    @property
    def staging(self) -> Path:
        return self.control / "staging"

    @property
    def history_file(self) -> Path:
        return self.control / "history.jsonl"

    @property
    def lock_file(self) -> Path:
        return self.control / "control.lock"

    @contextmanager
    def lock(self, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
        """Exclusive across processes for every command that changes versions, routing or the primary.

        flock is released by the kernel when the holder dies, so a killed command never leaves it taken.
        """
        self.control.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a+") as f:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        f.seek(0)
                        raise ControlLockTimeout(f"another command has held {self.lock_file} for over "
                                                 f"{timeout:.0f} s (holder: {f.read().strip() or 'unknown'})")
                    time.sleep(0.05)
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
            f.flush()
            try:
                yield
            finally:
                f.truncate(0)
                fcntl.flock(f, fcntl.LOCK_UN)

    def model_dir(self, model: str) -> Path:
        return Path(self.repository) / model

    def retired_dir(self, model: str) -> Path:
        return self.control / "retired" / model

    def served(self, model: str) -> list[int]:
        """Version folders in the repository, which Triton loads according to the version policy."""
        return version_numbers(self.model_dir(model))

    def retired(self, model: str) -> list[int]:
        return version_numbers(self.retired_dir(model))

    def next_version(self, model: str) -> int:
        """Numbers are never reused: a retired version keeps its number for a roll-forward."""
        return max(self.served(model) + self.retired(model), default=0) + 1

    def retire(self, model: str, version: int) -> None:
        target = self.retired_dir(model) / str(version)
        if target.exists():
            raise FileExistsError(f"{target} exists already")
        target.parent.mkdir(parents=True, exist_ok=True)
        durable_rename(self.model_dir(model) / str(version), target)

    def restore(self, model: str, version: int) -> None:
        target = self.model_dir(model) / str(version)
        if target.exists():
            raise FileExistsError(f"{target} exists already")
        durable_rename(self.retired_dir(model) / str(version), target)

    def record(self, event: dict) -> dict:
        """Append one event to the history (fsynced); raises OSError when it cannot be written.

        Commands record before they act, so a change is never made without its line.
        """
        entry = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "by": f"{getpass.getuser()}@{socket.gethostname()}", **event}
        self.control.mkdir(parents=True, exist_ok=True)
        with open(self.history_file, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return entry

    def history(self, model: str | None = None) -> list[dict]:
        if not self.history_file.exists():
            return []
        events = [json.loads(line) for line in self.history_file.read_text().splitlines() if line.strip()]
        return [e for e in events if model is None or e.get("model") == model]
