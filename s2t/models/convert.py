"""SavedModel -> ONNX with tf2onnx, then shaped for serving: two packed inputs, contract names, a feature spec.

tf2onnx turns each Keras StringLookup into an `ai.onnx.ml.CategoryMapper`. Strings are the expensive part of
serving (each hop serialises them, each backend converts them element by element), so the converter lifts the
lookups out of the graph: their vocabularies go into the feature spec (model metadata) that the adapter
applies, and the graph takes `categorical` (INT64 [batch, n_categorical]: vocabulary indices, and int64 features
as themselves) and `numeric` (FP32 [batch, n_numeric]); a feature of n values per record takes n columns. String
hash buckets (Keras `Hashing`, StringLookup's out-of-vocabulary buckets) of a string input are lifted too: the spec
records the hash, and the decoder computes the bucket as TensorFlow does.
tf2onnx runs with s2t's handlers (tf2onnx_handlers.py) for the look-ups and bucketing it does not convert exactly.
Parity against the SavedModel proves the split reproduces the legacy scores.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from s2t.atomic_files import write_atomically
from s2t.backends.records.feature_spec import (CATEGORICAL_INPUT, HASH, INTEGER, METADATA_KEY, NUMERIC_INPUT, PROBABILITY_OUTPUT,
                                               CategoricalFeature, FeatureSpec, value_column)
from s2t.backends.records.string_hash import FAST, STRONG
from s2t.models import example_signature
from s2t.errors import S2TError

BATCH_DIM = "batch"
# A conversion the runner has not finished in this long is killed (convert_many).
CONVERSION_TIMEOUT_S = 900.0
# The tf2onnx runner's options for many conversions in one process (convert_many).
JOBS_OPTION, RESULTS_OPTION = "--jobs", "--results"
MIN_OPSET = 15
_UNSUPPORTED_OP = re.compile(r"Tensorflow op \[(?P<node>[^:\]]+): (?P<op>[^\]]+)\] is not supported")
# A construct our tf2onnx handlers (s2t/models/tf2onnx_handlers.py) refuse: op|node|reason|way out.
_REFUSAL = re.compile(r"s2t-refusal\|(?P<op>[^|\n]+)\|(?P<node>[^|\n]+)\|(?P<reason>[^|\n]+)\|(?P<way_out>[^\n]+)")
# Any other handler failure: tf2onnx logs the node, then its own assertion, which is no help to the user.
_FAILED_NODE = re.compile(r"Failed to convert node '(?P<node>[^']+)'")
_NODE_OP = re.compile(r"OP=(?P<op>[A-Za-z0-9_]+)")
# Ops that tf2onnx maps to onnxruntime-extensions custom ops when asked for the contrib opset.
_CONTRIB_OPS = {"StringSplit", "StringSplitV2", "StaticRegexReplace", "RegexReplace", "StringJoin", "StringLower",
                "StringUpper", "StringToHashBucketFast", "StringStrip", "WordpieceTokenizeWithOffsets",
                "SentencepieceOp", "RegexSplitWithOffsets"}


class ConversionError(S2TError):
    """The SavedModel cannot be served as converted; the message says what and the way out."""


# Keras Hashing (FarmHash; SipHash when salted), StringLookup/IntegerLookup with num_oov_indices > 1 on strings,
# tf.feature_column's hash buckets: no ONNX operator computes these fingerprints.
_HASH_BUCKET_OPS = {"StringToHashBucketFast", "StringToHashBucketStrong", "StringToHashBucket", "Fingerprint"}


# The hash bucket ops the decoder computes (backends/records/string_hash.py) when they hash a string input directly:
# tf2onnx leaves them in the graph, pack_inputs lifts them.
HASHED_OPS = {"StringToHashBucketFast": FAST, "StringToHashBucketStrong": STRONG}
# What tf2onnx may leave unconverted, for this module to lift out of the graph into the feature spec.
LIFTED_OPS = frozenset({example_signature.PARSE_OP, *HASHED_OPS})


def _way_out(op: str) -> str:
    if op in _HASH_BUCKET_OPS:
        return ("no ONNX operator computes TensorFlow's string hash buckets, and s2t convert lifts them only where "
                "they hash a string feature as it arrives (Keras Hashing on a tf.Example feature): have the caller "
                "send the bucket as an int64 feature, or replace the hashing by a vocabulary lookup (StringLookup or "
                "IntegerLookup with num_oov_indices=1, a StaticHashTable), which s2t convert lifts exactly")
    if op == "ParseExample":
        return "export the signature with tf.io.parse_example (ParseExampleV2), whose parsing s2t convert lifts out"
    if op in _CONTRIB_OPS:
        return ("convert with tf2onnx's `--extra_opset ai.onnx.contrib:1` and serve with the onnxruntime-extensions "
                "custom op library (model config parameter `custom_op_library`)")
    return ("move the op out of the serving signature (do it in the caller or the adapter), or register a custom op "
            "with tf2onnx (`--custom-ops`) and provide its kernel as an ONNX Runtime custom op library")


def refusal_in_log(log: str, returncode: int, lifted_ops: frozenset[str] = frozenset()) -> ConversionError | None:
    """s2t's own refusal for what tf2onnx's log shows it could not convert (op, node, way out); None when it shows
    nothing of the kind. tf2onnx's own assertions never reach the user."""
    refusal = _REFUSAL.search(log)
    if refusal:
        return ConversionError(f"op {refusal['op']} at node {refusal['node']} cannot be converted exactly: "
                               f"{refusal['reason']}; {refusal['way_out']}")
    unsupported = [(m["op"], m["node"]) for m in _UNSUPPORTED_OP.finditer(log) if m["op"] not in lifted_ops]
    if unsupported:
        details = "; ".join(f"op {op} at node {node}: {_way_out(op)}" for op, node in dict.fromkeys(unsupported))
        return ConversionError(f"tf2onnx cannot convert {len(set(unsupported))} op(s): {details}")
    failed = _FAILED_NODE.search(log)
    if returncode != 0 and failed:
        op = _NODE_OP.search(log[failed.end():failed.end() + 2000])
        return ConversionError(f"{'op ' + op['op'] if op else 'the op'} at node {failed['node']} cannot be "
                               f"converted by tf2onnx: {_way_out(op['op'] if op else '')}")
    return None


def _tf2onnx_env() -> dict[str, str]:
    """The caller's environment as it is at the call, with TensorFlow's C++ logs cut to warnings and errors."""
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _tf2onnx_args(saved_model: Path, opset: int, output: Path) -> list[str]:
    return ["--saved-model", str(saved_model), "--signature_def", "serving_default", "--opset", str(opset),
            "--output", str(output)]


def _tf2onnx_result(saved_model: Path, log: str, returncode: int, out: Path, shapes: Path,
                    lifted_ops: frozenset[str]) -> tuple[onnx.ModelProto, dict]:
    refused = refusal_in_log(log, returncode, lifted_ops)
    if refused is not None:
        raise refused
    if returncode != 0 or not out.exists() or not shapes.exists():
        tail = "\n".join(log.strip().splitlines()[-8:])
        raise ConversionError(f"tf2onnx failed on {saved_model}:\n{tail}")
    return onnx.load(str(out)), json.loads(shapes.read_text())


def run_tf2onnx(saved_model: Path, opset: int, lifted_ops: frozenset[str] = frozenset()
                ) -> tuple[onnx.ModelProto, dict]:
    """The raw conversion, and what the runner read of the SavedModel's tf.Example parsing (its dense shapes, for
    example_signature.lift_from_saved_model); ops in `lifted_ops` may stay unconverted (tf2onnx keeps them as they
    are) for the caller to cut out."""
    with tempfile.TemporaryDirectory() as tmp:
        out, shapes = Path(tmp) / "raw.onnx", Path(tmp) / "dense_shapes.json"
        proc = subprocess.run(
            [sys.executable, "-m", "s2t.models.tf2onnx_handlers", example_signature.DENSE_SHAPES_OPTION, str(shapes),
             *_tf2onnx_args(saved_model, opset, out)],
            capture_output=True, text=True, env=_tf2onnx_env(),
        )
        return _tf2onnx_result(saved_model, proc.stdout + proc.stderr, proc.returncode, out, shapes, lifted_ops)


def _elem_type(value_info: onnx.ValueInfoProto) -> int:
    return value_info.type.tensor_type.elem_type


def _rank(value_info: onnx.ValueInfoProto) -> int:
    return len(value_info.type.tensor_type.shape.dim)


def _count(value_info: onnx.ValueInfoProto) -> int:
    """Values per record: the last dimension of a [batch, n] input with n > 1, else 1."""
    dims = value_info.type.tensor_type.shape.dim
    return dims[1].dim_value if len(dims) == 2 and dims[1].dim_value > 1 else 1


def _columns_of(name: str, count: int) -> list[str]:
    return [name] if count == 1 else [value_column(name, i) for i in range(count)]


def _column(source: str, index: int, rank: int, output: str, count: int = 1
            ) -> tuple[onnx.NodeProto, onnx.TensorProto]:
    """Gather the `count` columns of one feature from a packed input, keeping the rank the original input had
    ([batch], [batch, 1] or [batch, count])."""
    const = numpy_helper.from_array(np.array(index if rank == 1 else list(range(index, index + count)),
                                             dtype=np.int64), name=f"{output}__column")
    return helper.make_node("Gather", [source, const.name], [output], axis=1, name=f"{output}__unpack"), const


def pack_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, FeatureSpec]:
    """Replace per-attribute inputs by `categorical` and `numeric`; lift CategoryMapper vocabularies into a spec."""
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)

    categorical, numeric, new_nodes, consts, values = [], [], [], [], {}
    inserted: dict[int, list[onnx.NodeProto]] = {}  # nodes to put just before a node of the graph, by its id
    for inp in graph.input:
        kind = _elem_type(inp)
        count = _count(inp)
        if count > 1:
            values[inp.name] = count
        if kind == TensorProto.STRING:
            users = _lookups_of(inp.name, consumers, {o.name for o in graph.output})
            hashes = [u for u in users if u.op_type in HASHED_OPS]
            mappers = [u for u in users if u.op_type not in HASHED_OPS]
            remaps = {}
            if hashes:
                # The decoder computes the bucket from the string, as TensorFlow's hash does; the hash nodes
                # become the identity on that column. A string also looked up (StringLookup's out-of-vocabulary
                # buckets) carries both in its column, index * buckets + bucket, which the graph splits again.
                buckets, method, key = _hashing(inp.name, hashes, mappers)
                vocab, default = _vocabulary(mappers[0]) if mappers else ((), 0)
                categorical.extend(CategoricalFeature(c, dict(vocab), default, HASH, buckets, method, key)
                                   for c in _columns_of(inp.name, count))
                if mappers:
                    consts.append(numpy_helper.from_array(np.array(buckets, np.int64), f"{inp.name}__buckets"))
                    inserted.update(_split_index_and_bucket(f"{inp.name}__buckets", mappers, hashes))
                mappers = [] if mappers else hashes
            else:
                vocabularies = {_vocabulary(u) for u in mappers}
                if len(vocabularies) == 1:
                    vocab, default = vocabularies.pop()
                else:
                    vocab, default, remaps = _shared_vocabulary(inp.name, mappers)
                categorical.extend(CategoricalFeature(c, dict(vocab), default) for c in _columns_of(inp.name, count))
            # The column of indices takes the input's place; reshaping ops between it and the lookups work on
            # indices as they did on strings, and each lookup becomes the identity (one vocabulary) or a gather
            # of its own values by the shared index (several).
            node, const = _column(CATEGORICAL_INPUT, len(categorical) - count, _rank(inp), inp.name, count)
            new_nodes.append(node)
            consts.append(const)
            for mapper in mappers:
                mapper.op_type, mapper.domain = ("Gather" if remaps else "Identity"), ""
                del mapper.attribute[:]
                if remaps:
                    consts.append(remaps[id(mapper)])
                    mapper.input[:] = [remaps[id(mapper)].name, mapper.input[0]]
                    mapper.attribute.append(helper.make_attribute("axis", 0))
        elif kind == TensorProto.INT64:
            # An int64 feature travels as itself in the int64 `categorical` input; the graph's own use of it
            # (a lookup, a modulo, a cast) stays in the graph, exact.
            categorical.extend(CategoricalFeature(c, {}, 0, INTEGER) for c in _columns_of(inp.name, count))
            node, const = _column(CATEGORICAL_INPUT, len(categorical) - count, _rank(inp), inp.name, count)
            new_nodes.append(node)
            consts.append(const)
        elif kind == TensorProto.FLOAT:
            numeric.extend(_columns_of(inp.name, count))
            node, const = _column(NUMERIC_INPUT, len(numeric) - count, _rank(inp), inp.name, count)
            new_nodes.append(node)
            consts.append(const)
        else:
            raise ConversionError(f"input {inp.name!r} has ONNX type "
                                  f"{TensorProto.DataType.Name(kind)}; only strings, int64 and float32 can be packed")

    kept = [n for node in graph.node for n in (*inserted.get(id(node), ()), node)]
    del graph.node[:]
    graph.node.extend(new_nodes + kept)
    graph.initializer.extend(consts)
    del graph.input[:]
    if categorical:
        graph.input.append(helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64,
                                                         [BATCH_DIM, len(categorical)]))
    if numeric:
        graph.input.append(helper.make_tensor_value_info(NUMERIC_INPUT, TensorProto.FLOAT, [BATCH_DIM, len(numeric)]))
    if not any(n.domain == "ai.onnx.ml" for n in graph.node):
        kept_opsets = [o for o in model.opset_import if o.domain != "ai.onnx.ml"]
        del model.opset_import[:]
        model.opset_import.extend(kept_opsets)
    return model, FeatureSpec(tuple(categorical), tuple(numeric), values=values)


# Ops that only move or reshape values; tf2onnx puts them between a string input and its lookup (a Keras layer
# that squeezes its input first, say).
# A sparse feature's values are taken from its padded columns by a Compress (s2t/models/example_signature.py).
_RESHAPING_OPS = frozenset({"Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Compress"})
_STRING_USERS = frozenset({"CategoryMapper", "StringToHashBucketFast", "StringToHashBucketStrong"})


def _lookups_of(name: str, consumers: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> list[onnx.NodeProto]:
    """The CategoryMappers a string input reaches, through reshaping ops only; anything else is refused."""
    mappers, pending, seen = [], [name], set()
    while pending:
        tensor = pending.pop()
        users = consumers[tensor]
        bad = sorted({u.op_type for u in users if u.op_type not in _STRING_USERS and u.op_type not in _RESHAPING_OPS
                      or u.op_type in _RESHAPING_OPS and u.input[0] != tensor})
        if not users or bad or tensor in outputs:
            ops = sorted({u.op_type for u in users}) or ["nothing"]
            at = next((f" (node {u.name})" for u in users if u.op_type in bad and u.name), "")
            raise ConversionError(
                f"string input {name!r} feeds {', '.join(ops)}{at}; only vocabulary lookups "
                "(StringLookup -> CategoryMapper) and hash buckets (Hashing -> StringToHashBucketFast/Strong), "
                "reached through reshaping ops, can be moved out of the graph: look the strings up (a "
                "StaticHashTable, StringLookup; for a sparse feature, its values) or hash them before any other op")
        for user in users:
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.op_type in _STRING_USERS:
                mappers.append(user)
            else:
                pending.extend(user.output)
    return mappers


def _hashing(name: str, hashes: list[onnx.NodeProto], mappers: list[onnx.NodeProto]
             ) -> tuple[int, str, tuple[int, int]]:
    """The one hash a string input is bucketed by: bucket count, TensorFlow's hash and (strong) its key."""
    found = set()
    for node in hashes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        key = tuple(int(k) for k in attrs.get("key", (0, 0)))
        found.add((int(attrs["num_buckets"]), HASHED_OPS[node.op_type], key))
    first = hashes[0]
    if len({_vocabulary(m) for m in mappers}) > 1:
        raise ConversionError(
            f"op {first.op_type} at node {first.name} cannot be converted exactly: string input {name!r} is hashed "
            "and looked up in several vocabularies, which one column cannot carry; look it up in one vocabulary")
    if mappers and len(found) == 1:
        buckets, entries = next(iter(found))[0], [i for _, i in _vocabulary(mappers[0])[0]]
        largest = max([abs(i) for i in entries] + [abs(_vocabulary(mappers[0])[1])]) + 1
        if largest * buckets >= 2 ** 62:
            raise ConversionError(
                f"op {first.op_type} at node {first.name} cannot be converted exactly: string input {name!r} is "
                f"looked up and hashed into {buckets} buckets, too many to carry beside its index in one int64")
    if any(len(k) != 2 for _, _, k in found):
        raise ConversionError(f"op {first.op_type} at node {first.name} cannot be converted exactly: its key is not "
                              "two integers, which TensorFlow's strong hash takes; hash with a salt of one integer")
    if len(found) > 1:
        raise ConversionError(
            f"op {first.op_type} at node {first.name} cannot be converted exactly: string input {name!r} is hashed "
            f"{len(found)} different ways; one hash per string input can be lifted: hash a copy of the feature sent "
            "under another name")
    return found.pop()


def _split_index_and_bucket(buckets: str, mappers: list[onnx.NodeProto], hashes: list[onnx.NodeProto]
                            ) -> dict[int, list[onnx.NodeProto]]:
    """A column of index * buckets + bucket: each hash node becomes its floor modulo (the bucket, 0..buckets-1),
    each lookup the exact quotient (the index, -1 for a string out of the vocabulary); nodes to insert by id."""
    for node in hashes:
        node.op_type, node.domain = "Mod", ""
        del node.attribute[:]
        node.input[:] = [node.input[0], buckets]
        node.attribute.append(helper.make_attribute("fmod", 0))
    inserted = {}
    for node in mappers:
        column, out = node.input[0], node.output[0]
        bucket, whole = f"{out}__bucket", f"{out}__without_bucket"
        inserted[id(node)] = [helper.make_node("Mod", [column, buckets], [bucket], fmod=0, name=bucket),
                              helper.make_node("Sub", [column, bucket], [whole], name=whole)]
        node.op_type, node.domain = "Div", ""
        del node.attribute[:]
        node.input[:] = [whole, buckets]
    return inserted


def refuse_unlifted(model: onnx.ModelProto) -> None:
    """A hash bucket op whose string does not come from an input through reshaping ops only (the graph computes
    the string) cannot be lifted, and no ONNX operator computes it: refused naming it, before anything else."""
    producers = {out: node for node in model.graph.node for out in node.output}
    inputs = {i.name for i in model.graph.input}
    for node in model.graph.node:
        if node.op_type not in HASHED_OPS:
            continue
        tensor = node.input[0]
        while tensor in producers and producers[tensor].op_type in _RESHAPING_OPS:
            tensor = producers[tensor].input[0]
        if tensor not in inputs:
            raise ConversionError(f"tf2onnx cannot convert 1 op(s): op {node.op_type} at node {node.name}: "
                                  f"{_way_out(node.op_type)}")


def _shared_vocabulary(name: str, mappers: list[onnx.NodeProto]
                       ) -> tuple[tuple[tuple[str, int], ...], int, dict[int, onnx.TensorProto]]:
    """One string looked up in several tables: the index of each key in the union of their keys (the keys of none
    share the index after the last), and per table its values (its default last) to gather by that index."""
    tables = [(m, dict(_vocabulary(m)[0]), _vocabulary(m)[1]) for m in mappers]
    keys = list(dict.fromkeys(k for _, table, _ in tables for k in table))
    remaps = {id(m): numpy_helper.from_array(np.array([table.get(k, default) for k in keys] + [default], np.int64),
                                             name=f"{name}__table{i}__values") for i, (m, table, default) in
              enumerate(tables)}
    return tuple((k, i) for i, k in enumerate(keys)), len(keys), remaps


def _vocabulary(node: onnx.NodeProto) -> tuple[tuple[tuple[str, int], ...], int]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    strings = [s.decode() if isinstance(s, bytes) else s for s in attrs.get("cats_strings", [])]
    return tuple(zip(strings, (int(i) for i in attrs.get("cats_int64s", [])))), int(attrs.get("default_int64", -1))


def name_output(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    if len(graph.output) != 1:
        raise ConversionError(f"the signature has {len(graph.output)} outputs; a risk model has one (the probability)")
    old = graph.output[0].name
    for node in graph.node:
        node.output[:] = [PROBABILITY_OUTPUT if o == old else o for o in node.output]
        node.input[:] = [PROBABILITY_OUTPUT if i == old else i for i in node.input]
    graph.output[0].name = PROBABILITY_OUTPUT
    dims = graph.output[0].type.tensor_type.shape.dim
    if dims:
        dims[0].Clear()
        dims[0].dim_param = BATCH_DIM
    return model


def shape_for_serving(raw: onnx.ModelProto, defaults: dict[str, str | float | int] | None = None,
                      metadata: dict[str, str] | None = None, sparse: Mapping[str, int] | None = None
                      ) -> tuple[onnx.ModelProto, FeatureSpec]:
    refuse_unlifted(raw)
    model, spec = pack_inputs(raw)
    if defaults:
        spec = replace(spec, defaults=dict(defaults))
    if sparse:
        # A sparse feature's padded columns are packed as a feature of several values is; the spec says how a
        # record fills them.
        spec = replace(spec, values={k: n for k, n in spec.values.items() if k not in sparse}, sparse=dict(sparse))
    model = name_output(model)
    helper.set_model_props(model, {**(metadata or {}), METADATA_KEY: spec.to_json()})
    model.producer_name = "skill2triton"
    onnx.checker.check_model(model, full_check=True)
    return model, spec


def read_spec(model: onnx.ModelProto) -> FeatureSpec:
    props = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in props:
        raise ConversionError(f"the model has no {METADATA_KEY} metadata; convert it with `s2t convert`")
    return FeatureSpec.from_json(props[METADATA_KEY])


def parse_max_values(options: Sequence[str]) -> dict[str, int]:
    """`FEATURE=N` options -> {feature: N}; a malformed one is refused, naming it."""
    parsed: dict[str, int] = {}
    for option in options:
        key, _, most = option.rpartition("=")
        if not key or not most.isdigit() or int(most) <= 0 or key in parsed:
            raise ConversionError(f"--max-values {option!r}: expected FEATURE=N with N a positive integer, once per "
                                  "feature")
        parsed[key] = int(most)
    return parsed


def _check_options(opset: int, max_values: Mapping[str, int] | None) -> None:
    if opset < MIN_OPSET:
        raise ConversionError(f"opset {opset} is below {MIN_OPSET}, the lowest this project serves")
    bad = {k: v for k, v in (max_values or {}).items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0}
    if bad:
        raise ConversionError(f"--max-values must give a positive integer per feature, got {bad}")


def _shape_and_write(raw: onnx.ModelProto, dense_shapes: dict, output: Path, max_values: Mapping[str, int] | None
                     ) -> FeatureSpec:
    try:
        raw, defaults, metadata = example_signature.lift_from_saved_model(raw, dense_shapes, max_values)
    except example_signature.SignatureError as err:
        raise ConversionError(f"the tf.Example parsing cannot be lifted out: {err}") from None
    model, spec = shape_for_serving(raw, defaults, metadata, max_values)
    write_atomically(Path(output), model.SerializeToString())
    return spec


def convert(saved_model: Path, output: Path, opset: int = MIN_OPSET, max_values: Mapping[str, int] | None = None
            ) -> FeatureSpec:
    """`max_values`: the most values per record of each sparse or ragged tf.Example feature (the density rule)."""
    _check_options(opset, max_values)
    raw, dense_shapes = run_tf2onnx(Path(saved_model), opset, LIFTED_OPS)
    return _shape_and_write(raw, dense_shapes, output, max_values)


@dataclass(frozen=True, kw_only=True)
class Conversion:
    """One model of convert_many: what convert() takes."""
    saved_model: Path
    output: Path
    opset: int = MIN_OPSET
    max_values: Mapping[str, int] | None = None


def convert_many(conversions: Sequence[Conversion], workers: int | None = None
                 ) -> list[FeatureSpec | ConversionError]:
    """convert() of each model, with one TensorFlow start for all of them (most of a conversion's cost): the runner
    imports TensorFlow and tf2onnx once and converts each model in a child process of its own, `workers` at a time
    (default: one per CPU). Each result, in order, is the model's spec or why it was not converted; a model's
    failure is its own."""
    results: list[FeatureSpec | ConversionError | None] = [None] * len(conversions)
    with tempfile.TemporaryDirectory(prefix="s2t-convert-") as tmp:
        jobs, runs = [], []
        for index, conversion in enumerate(conversions):
            try:
                _check_options(conversion.opset, conversion.max_values)
            except ConversionError as err:
                results[index] = err
                continue
            folder = Path(tmp) / str(index)
            folder.mkdir()
            jobs.append({"args": _tf2onnx_args(Path(conversion.saved_model), conversion.opset, folder / "raw.onnx"),
                         "log": str(folder / "tf2onnx.log"), "dense_shapes_out": str(folder / "dense_shapes.json")})
            runs.append((index, folder))
        if jobs:
            plan, codes_file = Path(tmp) / "jobs.json", Path(tmp) / "results.json"
            plan.write_text(json.dumps({"jobs": jobs, "workers": workers or os.cpu_count() or 1,
                                        "timeout_s": CONVERSION_TIMEOUT_S}))
            proc = subprocess.run([sys.executable, "-m", "s2t.models.tf2onnx_handlers", JOBS_OPTION, str(plan),
                                   RESULTS_OPTION, str(codes_file)], capture_output=True, text=True, env=_tf2onnx_env())
            if proc.returncode != 0 or not codes_file.exists():
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
                failed = ConversionError(f"the tf2onnx runner failed before converting:\n{tail}")
                for index, _ in runs:
                    results[index] = failed
                return results
            for (index, folder), code in zip(runs, json.loads(codes_file.read_text())):
                conversion = conversions[index]
                log = (folder / "tf2onnx.log").read_text(errors="replace") if (folder / "tf2onnx.log").exists() else ""
                try:
                    raw, dense_shapes = _tf2onnx_result(Path(conversion.saved_model), log, code, folder / "raw.onnx",
                                                        folder / "dense_shapes.json", LIFTED_OPS)
                    results[index] = _shape_and_write(raw, dense_shapes, conversion.output, conversion.max_values)
                except ConversionError as err:
                    results[index] = err
    return results
