"""Serving signatures that take serialized tf.Example (TF Serving and Estimator exports): the parsing lifted out.

tf2onnx has no ParseExampleV2, and strings are the expensive part of serving anyway, so the converter cuts the
graph where the parse op hands its dense features to the rest: each parsed feature becomes a graph input named
as its tf.Example key, and the numeric graph behind it converts as any other (its StaticHashTable look-ups become
CategoryMappers, which s2t/models/convert.py lifts into the feature spec). What the parse op did moves to the adapter,
which reads tf.Example records without TensorFlow (backends/records/example_record.py): the keys become the spec's
feature names and the parse defaults the spec's defaults. A sparse (VarLenFeature) or ragged feature becomes its
values padded to the most a record may carry (given at convert time) and their count; nodes put where the parse was
rebuild from those the very tensors the parse gave, so the graph behind converts as it is. Parity against the
SavedModel, on the same serialized Examples, proves the split.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from s2t.backends.records.feature_spec import count_column, value_column

PARSE_OP = "ParseExampleV2"
# The tf2onnx runner's option naming the JSON file it writes the parse's dense shapes to (read_dense_shapes).
DENSE_SHAPES_OPTION = "--dense-shapes-out"
# The converted model keeps the name of the signature's input, so that parity can call the SavedModel with the
# same serialized Examples it sends to the converted model.
EXAMPLE_INPUT_KEY = "skill2triton.tf_example_input"
BATCH_DIM = "batch"
# ParseExampleV2(serialized, names, sparse_keys, dense_keys, ragged_keys, dense_defaults...)
_SERIALIZED, _SPARSE_KEYS, _DENSE_KEYS, _RAGGED_KEYS, _FIRST_DEFAULT = 0, 2, 3, 4, 5
_LIFTED_TYPES = frozenset({TensorProto.FLOAT, TensorProto.STRING, TensorProto.INT64})


class SignatureError(Exception):
    """The tf.Example signature cannot be lifted; the message names the feature and the reason."""


@dataclass(frozen=True)
class SparseFeature:
    """A tf.io.VarLenFeature (sparse) or tf.io.RaggedFeature: a varying number of values per example, at most
    `most` per record (the density rule, given at convert time)."""
    key: str
    elem_type: int  # ONNX TensorProto type of its values
    most: int
    ragged: bool = False
    split_type: int = TensorProto.INT64  # a ragged feature's row splits


@dataclass(frozen=True)
class DenseFeature:
    key: str
    elem_type: int  # ONNX TensorProto type of the parsed tensor
    shape: tuple[int, ...]  # per example, as tf.io.FixedLenFeature says: () or (1,)
    # the parse default (a tuple for a feature of several values); None: the feature is required
    default: str | float | int | tuple | None


def parse_node(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The graph's ParseExampleV2 node; None when the signature takes no serialized tf.Example."""
    nodes = [n for n in model.graph.node if n.op_type == PARSE_OP]
    if len(nodes) > 1:
        raise SignatureError(f"the signature parses tf.Example {len(nodes)} times; one parse can be lifted")
    return nodes[0] if nodes else None


def dense_features(node: onnx.NodeProto, initializers: Mapping[str, np.ndarray],
                   shapes: Mapping[str, tuple[int, ...]]) -> tuple[DenseFeature, ...]:
    """The dense features the parse op yields, from its constant inputs and the shapes the SavedModel declares."""
    keys = _texts(_constant(node, _DENSE_KEYS, initializers))
    if len(node.input) != _FIRST_DEFAULT + len(keys):
        raise SignatureError(f"the parse op has {len(node.input) - _FIRST_DEFAULT} defaults for {len(keys)} features")
    features = []
    for offset, key in enumerate(keys):
        default_name = node.input[_FIRST_DEFAULT + offset]
        default = _constant(node, _FIRST_DEFAULT + offset, initializers)
        is_text = default.dtype.kind in "OSU"
        elem_type = TensorProto.STRING if is_text else helper.np_dtype_to_tensor_dtype(default.dtype)
        _check_type(key, elem_type)
        if key not in shapes:
            raise SignatureError(f"the SavedModel declares no shape for feature {key!r} (default {default_name})")
        shape = tuple(shapes[key])
        if len(shape) > 1 and int(np.prod(shape[:-1], dtype=np.int64)) != 1 or 0 in shape:
            raise SignatureError(f"feature {key!r} has shape {list(shape)} per example; a record holds one value "
                                 "or a list of values")
        count = int(np.prod(shape, dtype=np.int64))
        features.append(DenseFeature(key, elem_type, shape, _default(key, default, count)))
    return tuple(features)


def sparse_features(node: onnx.NodeProto, initializers: Mapping[str, np.ndarray], most_values: Mapping[str, int]
                    ) -> tuple[SparseFeature, ...]:
    """The sparse features, then the ragged ones, the parse op yields (its output order), each with the most values
    per record `most_values` gives it; a feature without one is refused, naming the option that gives it."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    found = []
    for ragged, keys_input, types in ((False, _SPARSE_KEYS, attrs.get("sparse_types", [])),
                                      (True, _RAGGED_KEYS, attrs.get("ragged_value_types", []))):
        keys = _texts(_constant(node, keys_input, initializers))
        if len(keys) != len(types):
            raise SignatureError(f"the parse op has {len(types)} types for {len(keys)} "
                                 f"{'ragged' if ragged else 'sparse'} features")
        splits = list(attrs.get("ragged_split_types", [])) if ragged else [TensorProto.INT64] * len(keys)
        found.extend((ragged, key, int(kind), int(split)) for key, kind, split in zip(keys, types, splits))
    features = []
    for ragged, key, elem_type, split_type in found:
        kind = "ragged (RaggedFeature)" if ragged else "sparse (VarLenFeature)"
        _check_type(key, elem_type)
        if key not in most_values:
            raise SignatureError(f"{kind} feature {key!r} needs the most values a record may carry: convert with "
                                 f"--max-values {key}=N (a record with more is refused, naming the feature)")
        features.append(SparseFeature(key, elem_type, int(most_values[key]), ragged, split_type))
    unknown = sorted(set(most_values) - {f.key for f in features})
    if unknown:
        raise SignatureError(f"--max-values names {', '.join(unknown)}, which the signature does not parse as a "
                             "sparse or ragged feature")
    return tuple(features)


def _check_type(key: str, elem_type: int) -> None:
    if elem_type not in _LIFTED_TYPES:
        raise SignatureError(f"feature {key!r} is parsed as {TensorProto.DataType.Name(elem_type)}; a record "
                             "carries float32 numbers, int64 integers and strings")


def lift_parse_example(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
                       most_values: Mapping[str, int] | None = None
                       ) -> tuple[onnx.ModelProto, tuple[DenseFeature | SparseFeature, ...], str]:
    """The graph behind the parse op, its parsed features as inputs; the features; the signature's input name."""
    graph = model.graph
    node = parse_node(model)
    if node is None:
        raise SignatureError(f"the graph has no {PARSE_OP} node")
    serialized = node.input[_SERIALIZED]
    if [i.name for i in graph.input] != [serialized]:
        raise SignatureError(f"the signature takes {', '.join(i.name for i in graph.input)}; a tf.Example signature "
                             f"takes the serialized Examples ({serialized}) alone")
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    sparse = sparse_features(node, initializers, most_values or {})
    features = dense_features(node, initializers, shapes)
    n_sparse = sum(not f.ragged for f in sparse)
    n_ragged = len(sparse) - n_sparse
    # ParseExampleV2's outputs: sparse indices, values and shapes (one each per sparse feature), dense values,
    # ragged values and row splits.
    if len(node.output) != 3 * n_sparse + len(features) + 2 * n_ragged:
        raise SignatureError(f"the parse op has {len(node.output)} outputs for {n_sparse} sparse, {len(features)} "
                             f"dense and {n_ragged} ragged features")
    renamed = {node.output[3 * n_sparse + i]: f.key for i, f in enumerate(features)}
    rebuilt = {node.output[i + offset]: f.key for offset in (0, n_sparse, 2 * n_sparse)
               for i, f in enumerate(f for f in sparse if not f.ragged)}
    first_ragged = 3 * n_sparse + len(features)
    rebuilt.update({node.output[first_ragged + i + offset]: f.key for offset in (0, n_ragged)
                    for i, f in enumerate(f for f in sparse if f.ragged)})
    inputs = [helper.make_tensor_value_info(f.key, f.elem_type, [BATCH_DIM, *f.shape]) for f in features]
    new_nodes, consts = [], []
    sparse_outputs = [[node.output[i + offset] for offset in (0, n_sparse, 2 * n_sparse)] for i in range(n_sparse)]
    ragged_outputs = [[node.output[first_ragged + i + offset] for offset in (0, n_ragged)] for i in range(n_ragged)]
    for feature in sparse:
        outputs = ragged_outputs.pop(0) if feature.ragged else sparse_outputs.pop(0)
        nodes, constants = _rebuild_sparse(feature, outputs)
        new_nodes.extend(nodes)
        consts.extend(constants)
        inputs.extend([helper.make_tensor_value_info(feature.key, feature.elem_type, [BATCH_DIM, feature.most]),
                       helper.make_tensor_value_info(count_column(feature.key), TensorProto.INT64, [BATCH_DIM])])
    taken = {o for n in graph.node for o in n.output} | set(initializers)
    clashes = sorted({i.name for i in inputs} & taken)
    if clashes:
        raise SignatureError(f"feature names {', '.join(clashes)} are also tensor names in the graph")
    for output in graph.output:
        if output.name in renamed or output.name in rebuilt:
            raise SignatureError(f"the signature returns the parsed feature "
                                 f"{renamed.get(output.name) or rebuilt[output.name]!r} itself")
    for other in graph.node:
        other.input[:] = [renamed.get(i, i) for i in other.input]
    graph.node.remove(node)
    kept_nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(new_nodes + kept_nodes)
    del graph.input[:]
    graph.input.extend(inputs)
    used = {i for n in graph.node for i in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + consts)
    dropped = [v for v in graph.value_info if v.name in renamed or v.name in rebuilt]
    for value_info in dropped:
        graph.value_info.remove(value_info)
    return model, (*features, *sparse), serialized


def _rebuild_sparse(feature: SparseFeature, outputs: list[str]
                    ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes that compute, from the padded values [batch, most] and the count [batch] the decoder gives, exactly the
    tensors TensorFlow's parse gives for the feature: a sparse one's indices [n, 2] (row-major, as parsed), values
    [n] and dense shape [batch, the batch's largest count]; a ragged one's values [n] and row splits [batch + 1]."""
    key, prefix = feature.key, f"{feature.key}__parsed"
    count = count_column(key)
    consts = [numpy_helper.from_array(np.arange(feature.most, dtype=np.int64).reshape(1, -1), f"{prefix}__positions"),
              numpy_helper.from_array(np.array([1], np.int64), f"{prefix}__axis1"),
              numpy_helper.from_array(np.array([-1], np.int64), f"{prefix}__flat"),
              numpy_helper.from_array(np.array([0], np.int64), f"{prefix}__zero")]
    nodes = [
        helper.make_node("Unsqueeze", [count, f"{prefix}__axis1"], [f"{prefix}__count_column"],
                         name=f"{prefix}__count_column"),
        helper.make_node("Less", [f"{prefix}__positions", f"{prefix}__count_column"], [f"{prefix}__mask"],
                         name=f"{prefix}__mask"),
        helper.make_node("Reshape", [key, f"{prefix}__flat"], [f"{prefix}__flat_values"],
                         name=f"{prefix}__flat_values"),
        helper.make_node("Reshape", [f"{prefix}__mask", f"{prefix}__flat"], [f"{prefix}__flat_mask"],
                         name=f"{prefix}__flat_mask"),
        helper.make_node("Compress", [f"{prefix}__flat_values", f"{prefix}__flat_mask"], [outputs[0 if feature.ragged
                                                                                                  else 1]],
                         axis=0, name=f"{prefix}__values"),
    ]
    if feature.ragged:
        nodes += [helper.make_node("CumSum", [count, f"{prefix}__zero_axis"], [f"{prefix}__ends"],
                                   name=f"{prefix}__ends"),
                  helper.make_node("Concat", [f"{prefix}__zero", f"{prefix}__ends"], [f"{prefix}__splits"], axis=0,
                                   name=f"{prefix}__splits"),
                  helper.make_node("Cast", [f"{prefix}__splits"], [outputs[1]], to=feature.split_type,
                                   name=f"{prefix}__row_splits")]
        consts.append(numpy_helper.from_array(np.array(0, np.int64), f"{prefix}__zero_axis"))
        return nodes, consts
    nodes += [helper.make_node("NonZero", [f"{prefix}__mask"], [f"{prefix}__positions_of_values"],
                               name=f"{prefix}__positions_of_values"),
              helper.make_node("Transpose", [f"{prefix}__positions_of_values"], [outputs[0]], perm=[1, 0],
                               name=f"{prefix}__indices"),
              helper.make_node("Shape", [count], [f"{prefix}__batch"], name=f"{prefix}__batch"),
              # The batch's largest count (0 for none): ReduceMax over the counts and a zero, so an empty batch
              # has one too.
              helper.make_node("Concat", [count, f"{prefix}__zero"], [f"{prefix}__counts_and_zero"], axis=0,
                               name=f"{prefix}__counts_and_zero"),
              helper.make_node("ReduceMax", [f"{prefix}__counts_and_zero"], [f"{prefix}__width"], keepdims=1,
                               name=f"{prefix}__width"),
              helper.make_node("Concat", [f"{prefix}__batch", f"{prefix}__width"], [outputs[2]], axis=0,
                               name=f"{prefix}__dense_shape")]
    return nodes, consts


def lift_from_saved_model(model: onnx.ModelProto, dense_shapes_found: Mapping,
                          most_values: Mapping[str, int] | None = None
                          ) -> tuple[onnx.ModelProto, dict[str, str | float | int], dict[str, str]]:
    """The converted graph with its tf.Example parsing lifted out, the parse defaults and the metadata to keep; the
    graph unchanged (no defaults, no metadata) when its signature takes no serialized tf.Example.
    `dense_shapes_found`: what the tf2onnx runner wrote to its DENSE_SHAPES_OPTION file for the SavedModel."""
    if parse_node(model) is None:
        if most_values:
            raise SignatureError(f"--max-values names {', '.join(sorted(most_values))}, but the signature parses no "
                                 "tf.Example")
        return model, {}, {}
    model, features, example_input = lift_parse_example(model, read_dense_shapes(dense_shapes_found), most_values)
    defaults: dict[str, str | float | int] = {}
    for feature in features:
        if isinstance(feature, SparseFeature):
            continue
        if isinstance(feature.default, tuple):
            defaults.update({value_column(feature.key, i): v for i, v in enumerate(feature.default)})
        elif feature.default is not None:
            defaults[feature.key] = feature.default
    return model, defaults, {EXAMPLE_INPUT_KEY: example_input}


def read_dense_shapes(found: Mapping) -> dict[str, tuple[int, ...]]:
    """The shapes the tf2onnx runner found ({"dense_shapes": {key: shape}}), or its SignatureError ({"error": ...})."""
    if "error" in found:
        raise SignatureError(found["error"])
    return {key: tuple(shape) for key, shape in found["dense_shapes"].items()}


def saved_model_dense_shapes(saved_model: Path) -> dict[str, tuple[int, ...]]:
    """{feature key: shape per example} of every ParseExampleV2 in the SavedModel (tf2onnx drops `dense_shapes`).
    TensorFlow's protobuf classes: called where TensorFlow is loaded anyway (the tf2onnx runner)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(saved_model) / "saved_model.pb").read_bytes())
    shapes: dict[str, tuple[int, ...]] = {}
    for meta_graph in saved.meta_graphs:
        bodies = [meta_graph.graph_def.node] + [f.node_def for f in meta_graph.graph_def.library.function]
        for body in bodies:
            by_name = {n.name: n for n in body}
            for node in body:
                if node.op != PARSE_OP:
                    continue
                const = by_name.get(node.input[_DENSE_KEYS].lstrip("^").split(":")[0])
                if const is None or const.op != "Const":
                    raise SignatureError(f"the dense keys of {node.name} are not a constant")
                keys = [k.decode() for k in const.attr["value"].tensor.string_val]
                dims = [tuple(d.size for d in s.dim) for s in node.attr["dense_shapes"].list.shape]
                for key, shape in zip(keys, dims):
                    if shapes.setdefault(key, shape) != shape:
                        raise SignatureError(f"feature {key!r} is parsed with shapes {list(shapes[key])} and "
                                             f"{list(shape)}")
    return shapes


def _constant(node: onnx.NodeProto, index: int, initializers: Mapping[str, np.ndarray]) -> np.ndarray:
    name = node.input[index]
    if name not in initializers:
        raise SignatureError(f"input {index} of {node.name} ({name}) is not a constant; only a parse with constant "
                             "keys and defaults can be lifted")
    return initializers[name]


def _texts(values: np.ndarray) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values.ravel()]


def _default(key: str, default: np.ndarray, count: int) -> str | float | int | tuple | None:
    if default.size == 0:
        return None
    if default.size != count:
        raise SignatureError(f"feature {key!r} has a default of {default.size} values for {count} per example")
    values = tuple(_one_value(key, default.ravel()[i:i + 1]) for i in range(count))
    return values[0] if count == 1 else values


def _one_value(key: str, default: np.ndarray) -> str | float | int:
    value = default.ravel()[0]
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError(f"the default of feature {key!r} is not UTF-8 text") from None
    if default.dtype.kind in "iu":
        return int(value)
    return float(value)
