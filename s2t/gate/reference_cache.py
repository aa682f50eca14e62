"""The legacy side of the parity gate, kept: the SavedModel's scores on a data file, under a digest of both.

The reference is the same for every artifact gated against it, and computing it means starting TensorFlow (seconds
of full CPU, and most of a publish's cost). The candidate's side is never cached: it is what is being gated.
"""
from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Callable

import numpy as np

from s2t.atomic_files import write_atomically

# Where the gate keeps its reference scores when set; otherwise the caller's default (a publish: the repository's
# control area). Pointing several repositories at one directory shares the reference between them: the key is the
# content, never a path.
CACHE_ENV = "S2T_REFERENCE_CACHE"
SIGNATURE = "serving_default"
# Part of every key, so that a change in what is stored or how it is keyed never reads an older file.
FORMAT = "s2t-reference-v1"
# Written beside the SavedModel by `s2t legacy build` and read by nobody who scores: a new report is not a new model.
NOT_THE_MODEL = frozenset({"training_report.json"})


def _update_framed(digest, data: bytes) -> None:
    """Length first, so that no two different sequences of parts feed the digest the same bytes."""
    digest.update(len(data).to_bytes(8, "big"))
    digest.update(data)


def _file_digest(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def reference_key(saved_model: Path, data_file: Path, signature: str = SIGNATURE) -> str:
    """A digest of every file of the SavedModel (relative path and content), the data file's content and the
    signature scored: any changed byte of the model or the data, or another signature, is another key."""
    saved_model = Path(saved_model)
    files = sorted(p for p in saved_model.rglob("*") if p.is_file() and p.name not in NOT_THE_MODEL)
    if not files:
        raise FileNotFoundError(f"{saved_model}: no SavedModel files there")
    digest = hashlib.sha256()
    for part in (FORMAT, signature):
        _update_framed(digest, part.encode())
    for path in files:
        _update_framed(digest, path.relative_to(saved_model).as_posix().encode())
        _update_framed(digest, _file_digest(path))
    _update_framed(digest, b"data")
    _update_framed(digest, _file_digest(Path(data_file)))
    return digest.hexdigest()


def cache_dir(default: Path | None) -> Path | None:
    """The directory the gate keeps references in: CACHE_ENV if set, else `default` (None: no cache)."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    return Path(configured) if configured else default


def cached(directory: Path, key: str, rows: int) -> np.ndarray | None:
    """The stored scores, or None when there are none or they are not what the key promises (a torn or foreign
    file, another row count): a cache entry that cannot be trusted is recomputed, never used."""
    path = Path(directory) / f"{key}.npy"
    try:
        scores = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # EOFError: an empty file
        return None
    if scores.dtype.kind != "f" or scores.shape != (rows,):
        return None
    return scores


def store(directory: Path, key: str, scores: np.ndarray) -> None:
    """Keep the scores; a cache that cannot be written (a full disk, a read-only mount) costs the next gate time,
    never this one its answer."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(scores), allow_pickle=False)
    try:
        write_atomically(Path(directory) / f"{key}.npy", buffer.getvalue())
    except OSError:
        pass


def reference(saved_model: Path, data_file: Path, rows: int, compute: Callable[[], np.ndarray],
              directory: Path | None) -> tuple[np.ndarray, bool]:
    """The reference scores and whether they came from the cache; `compute` (TensorFlow) runs only on a miss."""
    if directory is None:
        return compute(), False
    key = reference_key(saved_model, data_file)
    hit = cached(directory, key, rows)
    if hit is not None:
        return hit, True
    scores = compute()
    store(directory, key, scores)
    return scores, False
