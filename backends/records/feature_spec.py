"""What the scorer expects: the feature order and the legacy vocabularies, read from the converted model.

`s2t convert` moves the SavedModel's string lookups out of the graph into this spec and stores it in the
ONNX file's metadata; the adapter applies it. The SavedModel stays the one source of truth, and parity
proves that the split reproduces it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from s2t.backends.records.string_hash import FAST, STRONG, hash_bucket

from s2t.wire.names import CATEGORICAL, NUMERIC, PROBABILITY

METADATA_KEY = "skill2triton.feature_spec"
CATEGORICAL_INPUT, NUMERIC_INPUT, PROBABILITY_OUTPUT = CATEGORICAL, NUMERIC, PROBABILITY


# How a categorical feature reaches the graph: its vocabulary index, (an int64 feature of a tf.Example
# signature) the integer itself, which the graph looks up or computes with as the SavedModel does, or (a string
# the SavedModel hashes: Keras `Hashing`) its hash bucket, computed as TensorFlow does
# (backends/records/string_hash.py).
VOCABULARY, INTEGER, HASH = "vocabulary", "integer", "hash"


@dataclass(frozen=True)
class CategoricalFeature:
    name: str
    vocabulary: dict[str, int]
    default_index: int
    kind: str = VOCABULARY
    # A HASH feature: its bucket count, TensorFlow's hash (string_hash.FAST or STRONG) and the strong hash's key;
    # with a vocabulary, its column is index * buckets + bucket, which the graph splits again.
    buckets: int = 0
    hash: str = ""
    key: tuple[int, int] = (0, 0)

    def index_of(self, value: str) -> int:
        if self.kind == HASH:
            bucket = hash_bucket(value, self.buckets, self.hash, self.key)
            # Hashed and looked up (StringLookup's out-of-vocabulary buckets): one int64 carries both.
            return bucket if not self.vocabulary else \
                self.vocabulary.get(value, self.default_index) * self.buckets + bucket
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
    # Features of a varying number of values per record (tf.io.VarLenFeature, tf.io.RaggedFeature): key -> the most
    # values a record may carry (the density rule, given at convert time). They take the columns
    # sparse_columns(key, most), padded past the record's values, and the int64 column count_column(key) with how
    # many it carries, from which the graph rebuilds the sparse or ragged tensor TensorFlow's parse gave.
    sparse: dict[str, int] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.categorical) + self.numeric

    @property
    def keys(self) -> tuple[str, ...]:
        """The features as a record carries them: a feature of several values once, under its key."""
        columns = {value_column(key, i): key for key, n in self.values.items() for i in range(n)}
        columns.update({c: key for key, most in self.sparse.items()
                        for c in (*sparse_columns(key, most), count_column(key))})
        return tuple(dict.fromkeys(columns.get(name, name) for name in self.names))

    def to_json(self) -> str:
        raw = {
            "categorical_input": CATEGORICAL_INPUT,
            "numeric_input": NUMERIC_INPUT,
            "categorical": [{"name": f.name, "vocabulary": f.vocabulary, "default_index": f.default_index,
                             **({"kind": f.kind} if f.kind != VOCABULARY else {}),
                             **({"buckets": f.buckets, "hash": f.hash, "key": list(f.key)} if f.kind == HASH else {})}
                            for f in self.categorical],
            "numeric": list(self.numeric),
        }
        if self.defaults:
            raw["defaults"] = self.defaults
        if self.values:
            raw["values"] = self.values
        if self.sparse:
            raw["sparse"] = self.sparse
        return json.dumps(raw, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "FeatureSpec":
        raw = json.loads(text)
        return cls(
            tuple(_categorical(c) for c in raw["categorical"]),
            tuple(str(n) for n in raw["numeric"]),
            {str(k): v for k, v in raw.get("defaults", {}).items()},
            {str(k): int(v) for k, v in raw.get("values", {}).items()},
            {str(k): _most_values(k, v) for k, v in raw.get("sparse", {}).items()},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "FeatureSpec":
        return cls.from_json(Path(path).read_text())


def value_column(key: str, index: int) -> str:
    """The column of value `index` of a feature of several values per record."""
    return f"{key}/{index}"


def sparse_columns(key: str, most: int) -> list[str]:
    """The value columns of a sparse or ragged feature of at most `most` values per record."""
    return [key] if most == 1 else [value_column(key, i) for i in range(most)]


def count_column(key: str) -> str:
    """The column holding how many values a record carries for a sparse or ragged feature."""
    return f"{key}/count"


def _most_values(key: str, most: object) -> int:
    if isinstance(most, bool) or not isinstance(most, int) or most <= 0:
        raise ValueError(f"sparse feature {key!r}: the most values per record must be a positive integer, got "
                         f"{most!r}")
    return most


def _categorical(raw: dict) -> CategoricalFeature:
    kind = _kind(raw.get("kind", VOCABULARY))
    feature = CategoricalFeature(raw["name"], {str(k): int(v) for k, v in raw["vocabulary"].items()},
                                 int(raw["default_index"]), kind)
    if kind != HASH:
        return feature
    buckets, method, key = int(raw["buckets"]), str(raw["hash"]), tuple(int(k) for k in raw.get("key", (0, 0)))
    if buckets <= 0 or method not in (FAST, STRONG) or len(key) != 2:
        raise ValueError(f"hashed feature {feature.name!r}: needs buckets > 0 (got {buckets}), hash {FAST!r} or "
                         f"{STRONG!r} (got {method!r}) and a key of two integers (got {len(key)})")
    return replace(feature, buckets=buckets, hash=method, key=key)


def _kind(kind: object) -> str:
    if kind not in (VOCABULARY, INTEGER, HASH):
        raise ValueError(f"unknown categorical feature kind {kind!r} (expected {VOCABULARY!r}, {INTEGER!r} or "
                         f"{HASH!r})")
    return str(kind)
