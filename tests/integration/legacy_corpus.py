"""A corpus of small legacy SavedModels, one per preprocessing construct: each serving signature parses serialized
tf.Example, applies the construct, and scores with a small seeded Keras net. Rows for parity come with
out-of-vocabulary values and missing features (parse defaults).

Models are tf.Modules (Keras 3 cannot apply TF ops to symbolic inputs); everything random has a fixed seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

PURPOSES = ["car", "education", "furniture", "repairs"]
BRANCHES = [101, 202, 303, 2 ** 40 + 7]  # an int64 key beyond float32's exact integers
BOUNDARIES = [500.0, 1500.0, 4000.0]


@dataclass(frozen=True)
class Construct:
    name: str
    # tf.Example features: name -> ("string" | "float" | "int64", default or None)
    features: dict[str, tuple[str, object]]
    # builds (module attributes, transform(parsed) -> float32 [batch, width]) inside TensorFlow
    build: Callable
    width: int
    refused_with: str | None = None  # the words `s2t convert` must refuse it with; None: it converts
    main: bool = False  # also served and compared live
    free_text: bool = False  # its string cells are mostly random text (unicode too), not a small vocabulary
    notes: dict = field(default_factory=dict)
    # The most values per record of each sparse or ragged feature, given to `s2t convert --max-values`.
    max_values: dict[str, int] = field(default_factory=dict)

    @property
    def convert_options(self) -> list[str]:
        return [option for key, most in self.max_values.items() for option in ("--max-values", f"{key}={most}")]


def _table_int32_values(tf, keras):
    # The most common way such a table is written: values from a Python list of ints, hence int32.
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(PURPOSES, [3, 1, 2, 7]), default_value=-1)
    return {"table": table}, lambda p: tf.cast(tf.one_hot(table.lookup(p["purpose"])[:, 0] + 1, 9), tf.float32)


def _table_float_values(tf, keras):
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(PURPOSES, tf.constant([0.15, 0.35, 0.2, 0.55], tf.float32)),
        default_value=tf.constant(0.5, tf.float32))
    return {"table": table}, lambda p: table.lookup(p["purpose"])


def _table_int64_keys(tf, keras):
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(BRANCHES, tf.int64), tf.constant([0, 1, 2, 3], tf.int64)),
        default_value=tf.constant(4, tf.int64))
    return {"table": table}, lambda p: tf.one_hot(table.lookup(p["branch"])[:, 0], 5)


def _table_bool_values(tf, keras):
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(PURPOSES, [True, False, True, False]),
                                      default_value=False)
    return {"table": table}, lambda p: tf.cast(table.lookup(p["purpose"]), tf.float32)


def _dense_hash_table(tf, keras):
    table = tf.lookup.experimental.DenseHashTable(tf.string, tf.int64, default_value=-1, empty_key="",
                                                  deleted_key="$deleted")
    table.insert(tf.constant(PURPOSES), tf.constant([0, 1, 2, 3], tf.int64))
    return {"table": table}, lambda p: tf.cast(table.lookup(p["purpose"]), tf.float32)


def _string_lookup_two_oov(tf, keras):
    layer = keras.layers.StringLookup(vocabulary=PURPOSES, num_oov_indices=2, output_mode="one_hot")
    return {"lookup": layer}, lambda p: tf.cast(layer(p["purpose"][:, 0]), tf.float32)


def _var_len(tf, keras):
    return {}, lambda p: tf.cast(tf.sparse.to_dense(p["tags"], default_value="")[:, :1] == "car", tf.float32)


def _var_len_to_dense(tf, keras):
    # Densified with a default and padded to a fixed width, as a legacy net that takes the first ids does.
    def transform(p):
        dense = tf.sparse.to_dense(p["ids"], default_value=-1)
        filler = tf.fill([tf.shape(dense)[0], 3], tf.constant(-1, tf.int64))
        return tf.cast(tf.concat([dense, filler], axis=1)[:, :3], tf.float32) / 10.0
    return {}, transform


def _var_len_reduce_sum(tf, keras):
    return {}, lambda p: tf.sparse.reduce_sum(p["amounts"], axis=1, keepdims=True) / 1000.0


def _embedding(tf, rows: int, seed: int):
    return tf.Variable(tf.random.stateless_normal([rows, 3], seed=[seed, 1]))


def _var_len_embedding_mean(tf, keras):
    embeddings = _embedding(tf, 10, 1)

    def transform(p):
        ids = p["ids"]
        return tf.nn.safe_embedding_lookup_sparse(
            embeddings, tf.sparse.SparseTensor(ids.indices, tf.math.floormod(ids.values, 10), ids.dense_shape),
            combiner="mean")
    return {"embeddings": embeddings}, transform


def _var_len_vocabulary_embedding(tf, keras, feature="tags"):
    """feature_column's categorical_column_with_vocabulary_list + embedding_column over a sparse string feature:
    each value looked up (-1 out of the vocabulary, which the safe lookup drops), embeddings combined by sqrtn."""
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(PURPOSES, tf.constant([0, 1, 2, 3],
                                                                                               tf.int64)),
                                      default_value=tf.constant(-1, tf.int64))
    embeddings = _embedding(tf, len(PURPOSES), 2)

    def transform(p):
        tags = p[feature]
        ids = tf.sparse.SparseTensor(tags.indices, table.lookup(tags.values), tags.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(embeddings, ids, combiner="sqrtn")
    return {"table": table, "embeddings": embeddings}, transform


def _ragged_to_tensor(tf, keras):
    return {}, lambda p: tf.cast(p["ids"].to_tensor(default_value=0, shape=[None, 3]), tf.float32) / 10.0


def _reduce_sum_of_computed_positions(tf, keras):
    # A sum over positions the graph computes (two values may land on one), which TensorFlow adds up.
    def transform(p):
        amounts = p["amounts"]
        return tf.sparse.reduce_sum(tf.sparse.SparseTensor(amounts.indices // 2, amounts.values, amounts.dense_shape),
                                    axis=1, keepdims=True)
    return {}, transform


def _var_len_multi_hot(tf, keras):
    layer = keras.layers.StringLookup(vocabulary=PURPOSES, output_mode="multi_hot")
    return {"lookup": layer}, lambda p: tf.cast(layer(p["tags"]), tf.float32)


def _several_values(tf, keras):
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(PURPOSES, [1, 2, 3, 4]), default_value=0)
    return {"table": table}, lambda p: tf.concat([p["history"] / 1000.0, tf.cast(p["codes"], tf.float32) / 5.0,
                                                  tf.cast(table.lookup(p["purposes"]), tf.float32)], axis=1)


def _main_constructs(tf, keras):
    """The constructs legacy risk models hold most: an int32-valued table, an int64-keyed lookup, bucketing, a
    salted hash of a string feature."""
    parts = [_table_int32_values(tf, keras), _integer_lookup(tf, keras), _discretization(tf, keras),
             _salted_hashing(tf, keras, "merchant"), _var_len_vocabulary_embedding(tf, keras),
             _var_len_reduce_sum(tf, keras)]
    attributes = {f"{key}_{i}": value for i, (held, _) in enumerate(parts) for key, value in held.items()}
    return attributes, lambda p: tf.concat([transform(p) for _, transform in parts], axis=1)


def _string_lookup(tf, keras):
    layer = keras.layers.StringLookup(vocabulary=PURPOSES, output_mode="one_hot")
    return {"lookup": layer}, lambda p: tf.cast(layer(p["purpose"][:, 0]), tf.float32)


def _integer_lookup(tf, keras):
    layer = keras.layers.IntegerLookup(vocabulary=BRANCHES, num_oov_indices=2, output_mode="one_hot")
    return {"lookup": layer}, lambda p: tf.cast(layer(p["branch"][:, 0]), tf.float32)


def _integer_lookup_multi_hot(tf, keras):
    # multi_hot over the feature and its neighbour id: Keras counts them with a bincount.
    layer = keras.layers.IntegerLookup(vocabulary=BRANCHES, num_oov_indices=1, output_mode="multi_hot")
    return {"lookup": layer}, lambda p: tf.cast(layer(tf.concat([p["branch"], p["branch"] + 101], axis=1)),
                                                tf.float32)


def _discretization(tf, keras):
    layer = keras.layers.Discretization(bin_boundaries=BOUNDARIES)
    return {"bins": layer}, lambda p: tf.one_hot(tf.cast(layer(p["amount"])[:, 0], tf.int32), len(BOUNDARIES) + 1)


def _normalization(tf, keras):
    layer = keras.layers.Normalization(mean=2500.0, variance=1.5e6)
    return {"norm": layer}, lambda p: tf.cast(layer(p["amount"]), tf.float32)


def _category_encoding(tf, keras):
    layer = keras.layers.CategoryEncoding(num_tokens=6, output_mode="one_hot")
    return {"encoding": layer}, lambda p: tf.cast(layer(tf.clip_by_value(p["rank"][:, 0], 0, 5)), tf.float32)


def _hashing(tf, keras, feature="purpose"):
    layer = keras.layers.Hashing(num_bins=8)
    return {"hashing": layer}, lambda p: tf.one_hot(layer(p[feature])[:, 0], 8)


def _salted_hashing(tf, keras, feature="purpose"):
    layer = keras.layers.Hashing(num_bins=8, salt=133)
    return {"hashing": layer}, lambda p: tf.one_hot(layer(p[feature])[:, 0], 8)


def _hashing_a_computed_string(tf, keras):
    # The hash of a string the graph computes (not one a record carries) cannot be lifted into the decoder.
    layer = keras.layers.Hashing(num_bins=8)
    return {"hashing": layer}, lambda p: tf.one_hot(layer(tf.strings.lower(p["purpose"]))[:, 0], 8)


PURPOSE = {"purpose": ("string", "other")}
CORPUS = (
    Construct("table_int32_values", PURPOSE, _table_int32_values, 9),
    Construct("table_float_values", PURPOSE, _table_float_values, 1),
    Construct("table_int64_keys", {"branch": ("int64", 0)}, _table_int64_keys, 5),
    Construct("keras_string_lookup", PURPOSE, _string_lookup, 5),
    Construct("keras_integer_lookup", {"branch": ("int64", -1)}, _integer_lookup, 6),
    Construct("keras_integer_lookup_multi_hot", {"branch": ("int64", -1)}, _integer_lookup_multi_hot, 5),
    Construct("keras_discretization", {"amount": ("float", 1000.0)}, _discretization, 4),
    Construct("keras_normalization", {"amount": ("float", 1000.0)}, _normalization, 1),
    Construct("keras_category_encoding", {"rank": ("int64", 0)}, _category_encoding, 6),
    Construct("table_bool_values", PURPOSE, _table_bool_values, 1),
    Construct("fixed_len_several_values", {"history": ("float[3]", [1000.0, 1000.0, 1000.0]),
                                           "codes": ("int64[2]", None), "purposes": ("string[2]", ["other", "other"])},
              _several_values, 3 + 2 + 2),
    Construct("main_constructs", {**PURPOSE, "branch": ("int64", -1), "amount": ("float", 1000.0),
                                  "merchant": ("string", "none"), "tags": ("varlen_string", None),
                                  "amounts": ("varlen_float", None)}, _main_constructs, 9 + 6 + 4 + 8 + 3 + 1,
              main=True, max_values={"tags": 4, "amounts": 3}),
    Construct("dense_hash_table", PURPOSE, _dense_hash_table, 1),
    Construct("keras_string_lookup_two_oov", PURPOSE, _string_lookup_two_oov, 6, free_text=True),
    Construct("var_len_feature", {"tags": ("varlen_string", None)}, _var_len, 1,
              refused_with="sparse (VarLenFeature) feature 'tags' needs the most values a record may carry: "
                           "convert with --max-values tags=N"),
    Construct("var_len_int64_to_dense", {"ids": ("varlen_int64", None)}, _var_len_to_dense, 3,
              max_values={"ids": 3}),
    Construct("var_len_float_reduce_sum", {"amounts": ("varlen_float", None)}, _var_len_reduce_sum, 1,
              max_values={"amounts": 4}),
    Construct("var_len_embedding_mean", {"ids": ("varlen_int64", None)}, _var_len_embedding_mean, 3,
              max_values={"ids": 5}),
    Construct("var_len_vocabulary_embedding", {"tags": ("varlen_string", None)}, _var_len_vocabulary_embedding, 3,
              max_values={"tags": 4}),
    Construct("ragged_feature_to_tensor", {"ids": ("ragged_int64", None)}, _ragged_to_tensor, 3,
              max_values={"ids": 3}),
    Construct("var_len_strings_compared", {"tags": ("varlen_string", None)}, _var_len, 1, max_values={"tags": 2},
              refused_with="string input 'tags' feeds ScatterND (node"),
    Construct("var_len_reduce_sum_of_computed_positions", {"amounts": ("varlen_float", None)},
              _reduce_sum_of_computed_positions, 1, max_values={"amounts": 4},
              refused_with="op SparseReduceSum at node"),
    Construct("var_len_keras_multi_hot", {"tags": ("varlen_string", None)}, _var_len_multi_hot, 5,
              max_values={"tags": 4}, refused_with="op SparseBincount at node"),
    Construct("keras_hashing", PURPOSE, _hashing, 8, free_text=True),
    Construct("keras_hashing_salted", PURPOSE, _salted_hashing, 8, free_text=True),
    Construct("hashing_a_computed_string", PURPOSE, _hashing_a_computed_string, 8,
              refused_with="op StringToHashBucketFast at node"),
)
BY_NAME = {c.name: c for c in CORPUS}
# Every model also reads `age` (a float without a default: a missing age is refused by every side).
COMMON = {"age": ("float", None)}


def build(construct: Construct, path: Path, seed: int = 7) -> None:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    kinds = {"string": tf.string, "float": tf.float32, "int64": tf.int64}
    features = {**construct.features, **COMMON}
    spec = {}
    for name, (kind, default) in features.items():
        base, count = _kind_and_count(kind)
        if base.startswith(("varlen_", "ragged_")):
            # A varying number of values per example: sparse (VarLenFeature) or ragged (RaggedFeature).
            parse = tf.io.VarLenFeature if base.startswith("varlen_") else tf.io.RaggedFeature
            spec[name] = parse(kinds[base.partition("_")[2]])
        else:
            spec[name] = tf.io.FixedLenFeature([count], kinds[base], default_value=default if default is None or
                                               count > 1 else [default])
    attributes, transform = construct.build(tf, keras)

    class LegacyModel(tf.Module):
        def __init__(self):
            super().__init__()
            for key, value in attributes.items():
                setattr(self, key, value)
            self.net = keras.Sequential([keras.Input((construct.width + 1,)), keras.layers.Dense(6, activation="tanh"),
                                         keras.layers.Dense(1, activation="sigmoid")])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            parsed = tf.io.parse_example(examples, spec)
            inputs = tf.concat([tf.reshape(transform(parsed), [-1, construct.width]), parsed["age"] / 20.0 - 2.0],
                               axis=1)
            return {"score": self.net(inputs)}

    model = LegacyModel()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})


def _kind_and_count(kind: str) -> tuple[str, int]:
    """'float' -> ('float', 1); 'float[3]' -> ('float', 3): a feature of three values per example."""
    base, _, count = kind.partition("[")
    return base, int(count.rstrip("]") or 1)


# Text for the hashed features: ASCII, accents, CJK, emoji, inner spaces (no comma, quote or line break: CSV cells).
_FREE_TEXT = "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 -_.:/éüß漢字😀"


def _cell(rng, name: str, kind: str, count: int, free_text: bool = False) -> str:
    if kind == "string" and free_text and rng.random() < 0.3:
        return str(rng.choice(PURPOSES))  # in the vocabulary, where the model has one
    if kind == "string" and free_text:
        text = "".join(rng.choice(list(_FREE_TEXT), size=int(rng.integers(1, 24))))
        return text.strip() or "x"
    if kind == "string":
        # "car " (a trailing space) is out of vocabulary too, where a cell holds one value.
        return str(rng.choice(PURPOSES + ["yacht", "Car"] + (["car "] if count == 1 else [])))
    if name == "branch":
        return str(rng.choice(BRANCHES + [7, -3, 2 ** 40 + 8, 2 ** 62]))
    if name == "ids":
        return str(int(rng.integers(-3, 25)))
    if kind == "int64":
        return str(int(rng.integers(-2, 9)))
    return f"{rng.choice([rng.uniform(0, 6000), rng.choice(BOUNDARIES)]):.2f}"


def rows(construct: Construct, n: int, seed: int = 3) -> list[dict[str, str]]:
    """CSV rows: in-vocabulary values, out-of-vocabulary ones, and (every 10th row) the construct's feature left
    out for its parse default; every 50th row (another one) leaves out `age`, which no side may score."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        row = {"age": str(int(rng.integers(18, 80)))}
        for name, (kind, default) in construct.features.items():
            base, count = _kind_and_count(kind)
            # A feature of several values is one cell of them separated by spaces (as `s2t parity` reads it).
            if name in construct.max_values:
                # A sparse feature: 0 up to the most values ("[]": an empty list), or (every 10th row) left out.
                values = int(rng.integers(0, construct.max_values[name] + 1))
                row[name] = " ".join(_cell(rng, name, base.partition("_")[2], 2) for _ in range(values)) or "[]"
                if i % 10 == 9:
                    row[name] = ""
                continue
            row[name] = " ".join(_cell(rng, name, base, count, construct.free_text) for _ in range(count))
            if i % 10 == 9 and default is not None:
                row[name] = ""
        if i % 50 == 24:
            row["age"] = ""
        out.append(row)
    return out


def write_csv(path: Path, data: list[dict[str, str]]) -> Path:
    columns = sorted({c for r in data for c in r})
    path.write_text("\n".join([",".join(columns)] + [",".join(r.get(c, "") for c in columns) for r in data]) + "\n",
                    encoding="utf-8")
    return path
