"""How a Triton model repository lays out versions: `<repository>/<model>/<N>/` with N a positive number."""
from __future__ import annotations

from pathlib import Path


def version_numbers(folder: Path) -> list[int]:
    """The numbered version folders of a model folder, oldest first; none when the folder does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
