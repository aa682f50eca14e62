"""The python backend's stub processes, read from their command line in one place.

Triton's python backend (and each Python-based backend) starts one stub per model instance as
`triton_python_backend_stub MODEL_FILE SHM_REGION SHM_SIZE SHM_GROWTH SERVER_PID BACKEND_DIR IPC_SIZE INSTANCE ...`
(python_backend's stub launcher, the same from 2.51 to 25.08). The region is created as /dev/shm/SHM_REGION.
While loading, the backend also starts a short-lived stub to complete the config, whose INSTANCE is the model's name.

Standard library only (the keeper runs on the NGC image's Python).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STUB_BINARY = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")


@dataclass(frozen=True, kw_only=True)
class StubCommand:
    model_file: Path
    # The name of its shared-memory region in SHM_DIR.
    region: str
    # The server it was started by; None where its command line stops short of it.
    server_pid: int | None
    # Its model instance (`risk_scorer_0_0`); None where its command line stops short of it.
    instance: str | None

    @property
    def model(self) -> str:
        return self.model_file.parent.parent.name

    @property
    def version(self) -> str:
        return self.model_file.parent.name

    @property
    def completes_config(self) -> bool:
        """The stub the backend starts while loading, to complete the model's config: not an instance."""
        return self.instance == self.model


def parse(argv: list[str]) -> StubCommand | None:
    """`argv` as /proc/PID/cmdline gives it; None when it is not a stub's."""
    if len(argv) < 3 or not argv[0].endswith(STUB_BINARY):
        return None
    try:
        server_pid = int(argv[5]) if len(argv) > 5 else None
    except ValueError:
        server_pid = None
    return StubCommand(model_file=Path(argv[1]), region=argv[2].lstrip("/"), server_pid=server_pid,
                       instance=argv[8] if len(argv) > 8 else None)


def command_line(pid: int, proc: Path = PROC) -> list[str]:
    """Raises OSError when the process is gone (or not readable)."""
    return (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")


def read(pid: int, proc: Path = PROC) -> StubCommand | None:
    """The stub command of process `pid`; None when it is not a stub or is gone."""
    try:
        return parse(command_line(pid, proc))
    except OSError:
        return None
