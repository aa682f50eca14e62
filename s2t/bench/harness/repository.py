"""The benchmark's copies of model repositories, and the one way it edits a copy's config.pbtxt (protobuf).

Every mode measures copies: the hot swap publishes and rolls back versions, `s2t serve` keeps its supervisor state
in a repository's control area, and nothing a user serves from the working tree may change under a benchmark (nor
the benchmark under someone editing a config).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Iterable

from google.protobuf import text_format

from s2t import triton_config

IGNORED = shutil.ignore_patterns("__pycache__")


def copy_repository(source: Path, dest: Path, models: Iterable[str] | None = None) -> Path:
    """`source` (every model, or only `models`) copied into the folder `dest`; returns `dest`."""
    source, dest = Path(source), Path(dest)
    if models is None:
        shutil.copytree(source, dest, ignore=IGNORED)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        for model in models:
            shutil.copytree(source / model, dest / model, ignore=IGNORED)
    return dest


def copy_repositories(sources: Iterable[Path], dest: Path) -> list[Path]:
    """Each repository copied into `dest` under a name of its own (its position, then its folder's name)."""
    return [copy_repository(source, Path(dest) / f"{number}-{Path(source).resolve().name}")
            for number, source in enumerate(sources)]


def edited(text: str, change: Callable) -> str:
    """config.pbtxt `text` parsed as Triton's ModelConfig, changed in place by `change(config)`, written back
    (comments are not kept: a copy to measure)."""
    config = triton_config.load_text(text)
    change(config)
    return text_format.MessageToString(config)


def edit_config(model_dir: Path, change: Callable) -> Path:
    """The config.pbtxt of the model folder `model_dir`, changed by `change(config)` (see `edited`)."""
    path = Path(model_dir) / "config.pbtxt"
    path.write_text(edited(path.read_text(), change))
    return path
