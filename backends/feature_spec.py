"""What the scorer expects: the feature order and the legacy vocabularies, read from the converted model.

`s2t convert` moves the SavedModel's string lookups out of the graph into this spec and stores it in the
ONNX file's metadata; the adapter applies it. The SavedModel stays the one source of truth, and parity
proves that the split reproduces it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from wire.names import CATEGORICAL, NUMERIC, PROBABILITY

METADATA_KEY = "skill2triton.feature_spec"
CATEGORICAL_INPUT, NUMERIC_INPUT, PROBABILITY_OUTPUT = CATEGORICAL, NUMERIC, PROBABILITY


# How a categorical feature reaches the graph: its vocabulary index, or (an int64 feature of a tf.Example
# signature) the integer itself, which the graph looks up or computes with as the SavedModel does.
VOCABULARY, INTEGER = "vocabulary", "integer"


@dataclass(frozen=True)
class CategoricalFeature:
    name: str
    vocabulary: dict[str, int]
    default_index: int
    kind: str = VOCABULARY

    def index_of(self, value: str) -> int:
        return self.vocabulary.get(value, self.default_index)


@dataclass(frozen=True)
class FeatureSpec:
    categorical: tuple[CategoricalFeature, ...]
    numeric: tuple[str, ...]
    # The value a record without the feature takes, for models that had one (a tf.Example parse default); a
    # feature without a default is required.
    defaults: dict[str, str | float | int] = field(default_factory=dict)
    # Features of more than one value per record (tf.io.FixedLenFeature([n])): key -> n. Value i is the column
    # named value_column(key, i); a record carries the key with a list of n values.
    values: dict[str, int] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.categorical) + self.numeric

    @property
    def keys(self) -> tuple[str, ...]:
        """The features as a record carries them: a feature of several values once, under its key."""
        columns = {value_column(key, i): key for key, n in self.values.items() for i in range(n)}
        return tuple(dict.fromkeys(columns.get(name, name) for name in self.names))

    def to_json(self) -> str:
        raw = {
            "categorical_input": CATEGORICAL_INPUT,
            "numeric_input": NUMERIC_INPUT,
            "categorical": [{"name": f.name, "vocabulary": f.vocabulary, "default_index": f.default_index,
                             **({"kind": f.kind} if f.kind != VOCABULARY else {})} for f in self.categorical],
            "numeric": list(self.numeric),
        }
        if self.defaults:
            raw["defaults"] = self.defaults
        if self.values:
            raw["values"] = self.values
        return json.dumps(raw, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "FeatureSpec":
        raw = json.loads(text)
        return cls(
            tuple(CategoricalFeature(c["name"], {str(k): int(v) for k, v in c["vocabulary"].items()},
                                     int(c["default_index"]), _kind(c.get("kind", VOCABULARY)))
                  for c in raw["categorical"]),
            tuple(str(n) for n in raw["numeric"]),
            {str(k): v for k, v in raw.get("defaults", {}).items()},
            {str(k): int(v) for k, v in raw.get("values", {}).items()},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "FeatureSpec":
        return cls.from_json(Path(path).read_text())


def value_column(key: str, index: int) -> str:
    """The column of value `index` of a feature of several values per record."""
    return f"{key}/{index}"


def _kind(kind: object) -> str:
    if kind not in (VOCABULARY, INTEGER):
        raise ValueError(f"unknown categorical feature kind {kind!r} (expected {VOCABULARY!r} or {INTEGER!r})")
    return str(kind)
