"""How a Triton model repository lays out versions: `<repository>/<model>/<N>/` with N a positive number, and where
the control area beside it is (`<repository>/../.<repository name>.s2t/`, which Triton never polls)."""
from __future__ import annotations

from pathlib import Path


def version_numbers(folder: Path) -> list[int]:
    """The numbered version folders of a model folder, oldest first; none when the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())


def control_folder(repository: Path) -> Path:
    """The control area of a repository: staging, retired versions, history, rollout state, live switches."""
    repo = Path(repository).resolve()
    return repo.parent / f".{repo.name}.s2t"


def live_switch_file(repository: Path, model: str) -> Path:
    """Where the rollout commands name the scorer version `model` serves now, among those it keeps warm."""
    return control_folder(repository) / "live" / f"{model}.json"
