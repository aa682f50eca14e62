"""tf2onnx handlers for the lookups and bucketing legacy preprocessing leaves in a serving signature.

tf2onnx 1.17 converts a `LookupTableFindV2` only for string keys and int64 values, and has no `Bucketize`
(Keras `Discretization`, `tf.feature_column.bucketized_column`). Legacy models hold tables of every kind: a
`StaticHashTable` built from a Python list of ints has int32 values, Keras `IntegerLookup` has int64 keys, score
tables have float values. Each is rewritten to ONNX operators that give the same values bit for bit:

- string keys: an `ai.onnx.ml.CategoryMapper` (string -> int64), which `s2t convert` lifts into the feature spec;
  int32 values are its int64 values cast back, other values are gathered by the key's position;
- integer keys: the keys are cast to their decimal text first (exact for every int64), then as string keys;
- `Bucketize`: the number of boundaries at or below the value, which is TensorFlow's bucket index;
- integer `FloorMod`: ONNX `Mod` (tf2onnx's own rewrite truncates, and differs for negative numbers);
- `SparseReduceSum` (`tf.sparse.reduce_sum`, which tf2onnx lacks) of a parsed sparse feature: a dense sum;
- `SparseReshape`, `SparseFillEmptyRows`, `RaggedTensorToTensor`, `RaggedTensorToSparse`: tf2onnx's rewrites, with
  their integer divisions safe for a batch whose records carry no value of the feature.

What these handlers cannot rewrite exactly is refused by raising `Refusal`, whose message `s2t convert` shows with
the node; the runner below reports it on one line that convert.py parses.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from tf2onnx import constants
from tf2onnx.handler import tf_op

# The line the runner prints for a refusal: `s2t convert` turns it into its own message.
REFUSAL_PREFIX = "s2t-refusal"
_INTEGER_KEYS = (TensorProto.INT64, TensorProto.INT32)
_GATHERED_VALUES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.STRING, TensorProto.BOOL)
_ALL_INTEGERS = (TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                 TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64)


class Refusal(Exception):
    """A construct the handlers cannot convert exactly: op, node, why, and the way out."""

    def __init__(self, op: str, node: str, reason: str, way_out: str):
        super().__init__(f"{REFUSAL_PREFIX}|{op}|{node}|{reason}|{way_out}")


def _text(values: np.ndarray) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in values.ravel()]


def _const(ctx, name: str, value: np.ndarray) -> str:
    return ctx.make_const(name, value).output[0]


class LookupTableFind:
    @classmethod
    def version_8(cls, ctx, node, initialized_tables, **kwargs):
        table = node.inputs[0]
        while table.type == "Identity":
            table = table.inputs[0]
        shared_name = table.get_attr_value("shared_name")
        if shared_name not in (initialized_tables or {}):
            raise Refusal(node.type, node.name, "its table is not filled by a constant initializer",
                          "build the table with tf.lookup.KeyValueTensorInitializer or a vocabulary file")
        if not node.inputs[2].is_const():
            raise Refusal(node.type, node.name, "its default value is computed, not a constant",
                          "give the table a constant default_value")
        keys, values = initialized_tables[shared_name]
        default = np.asarray(node.inputs[2].get_tensor_value(as_list=False))
        key_type, value_type = ctx.get_dtype(node.input[1]), ctx.get_dtype(node.output[0])
        if key_type not in (TensorProto.STRING, *_INTEGER_KEYS):
            raise Refusal(node.type, node.name, f"its keys are {TensorProto.DataType.Name(key_type)}",
                          "look up strings or integers (cast the keys in the caller)")
        if value_type not in (*_INTEGER_KEYS, *_GATHERED_VALUES):
            raise Refusal(node.type, node.name, f"its values are {TensorProto.DataType.Name(value_type)}",
                          "store int32, int64, float, bool or string values")
        if default.size != 1:
            raise Refusal(node.type, node.name, f"its default has {default.size} values", "use a scalar default")
        name, keys_in, outputs, shape = node.name, node.input[1], node.output, ctx.get_shape(node.input[1])
        ctx.remove_node(name)
        if key_type in _INTEGER_KEYS:
            keys_in = ctx.make_node("Cast", [keys_in], attr={"to": TensorProto.STRING}, name=f"{name}/key_text",
                                    shapes=[shape], dtypes=[TensorProto.STRING]).output[0]
        cats = _text(keys)
        if value_type in _INTEGER_KEYS:
            # The mapper yields the values themselves; int32 values (and default) fit int64 exactly.
            attr = {"cats_strings": cats, "cats_int64s": [int(v) for v in values.ravel()],
                    "default_int64": int(default.ravel()[0])}
            mapper_out = outputs if value_type == TensorProto.INT64 else [f"{name}/values64"]
            ctx.make_node("CategoryMapper", [keys_in], outputs=mapper_out, attr=attr, name=name,
                          domain=constants.AI_ONNX_ML_DOMAIN, shapes=[shape], dtypes=[TensorProto.INT64])
            if value_type != TensorProto.INT64:
                ctx.make_node("Cast", mapper_out, outputs=outputs, attr={"to": value_type}, name=f"{name}/values",
                              shapes=[shape], dtypes=[value_type])
            return
        # Other values: the mapper yields the key's position (the default's position when absent), and the values,
        # the default appended, are gathered by it.
        attr = {"cats_strings": cats, "cats_int64s": list(range(len(cats))), "default_int64": len(cats)}
        position = ctx.make_node("CategoryMapper", [keys_in], attr=attr, name=f"{name}/position",
                                 domain=constants.AI_ONNX_ML_DOMAIN, shapes=[shape],
                                 dtypes=[TensorProto.INT64]).output[0]
        table_values = np.concatenate([values.ravel(), default.ravel().astype(values.dtype)])
        if value_type == TensorProto.STRING:
            table_values = np.array(_text(table_values), dtype=object)
        gathered = _const(ctx, f"{name}/table_values", table_values)
        ctx.make_node("Gather", [gathered, position], outputs=outputs, attr={"axis": 0}, name=f"{name}/gather",
                      shapes=[shape], dtypes=[value_type])


class Bucketize:
    @classmethod
    def version_11(cls, ctx, node, **kwargs):
        boundaries = np.asarray(node.get_attr_value("boundaries"), dtype=np.float32)
        if boundaries.size == 0 or np.any(np.diff(boundaries) < 0):
            raise Refusal(node.type, node.name, "its boundaries are empty or not sorted",
                          "give Discretization sorted bin boundaries")
        input_type = ctx.get_dtype(node.input[0])
        name, value, outputs, shape = node.name, node.input[0], node.output, ctx.get_shape(node.input[0])
        ctx.remove_node(name)
        if input_type != TensorProto.FLOAT:
            # TensorFlow compares in the input's type; boundaries given as floats compare the same in float32 for
            # the int32 and float64 inputs Discretization accepts, within float32's exact integers.
            value = ctx.make_node("Cast", [value], attr={"to": TensorProto.FLOAT}, name=f"{name}/as_float").output[0]
        axis = _const(ctx, f"{name}/last_axis", np.array([-1], np.int64))
        expanded = ctx.make_node("Unsqueeze", [value, axis], name=f"{name}/expand").output[0]
        at_or_above = ctx.make_node("GreaterOrEqual", [expanded, _const(ctx, f"{name}/boundaries", boundaries)],
                                    name=f"{name}/compare").output[0]
        counted = ctx.make_node("Cast", [at_or_above], attr={"to": TensorProto.INT32}, name=f"{name}/count").output[0]
        ctx.make_node("ReduceSum", [counted, axis], outputs=outputs, attr={"keepdims": 0}, name=f"{name}/bucket",
                      shapes=[shape], dtypes=[TensorProto.INT32])


class FloorMod:
    @classmethod
    def version_10(cls, ctx, node, **kwargs):
        """tf2onnx computes an integer FloorMod as x - (x / y) * y with ONNX's truncating division, which is wrong for
        negative x (-3 mod 2 gives -1, TensorFlow 1; Keras IntegerLookup's out-of-vocabulary buckets use it). ONNX
        Mod with fmod=0 is the floor modulo for integers."""
        if ctx.get_dtype(node.input[0]) not in _ALL_INTEGERS:
            from tf2onnx.onnx_opset.math import FloorMod as Tf2onnxFloorMod
            Tf2onnxFloorMod.version_7(ctx, node, **kwargs)
            return
        node.type = "Mod"
        node.set_attr("fmod", 0)


class SparseReduceSum:
    @classmethod
    def version_13(cls, ctx, node, **kwargs):
        """`tf.sparse.reduce_sum` of a sparse feature as parsed: its values scattered into zeros of its dense shape,
        then summed over the same axes. A parsed sparse tensor has one value per position (ScatterND needs that);
        the sum of one elsewhere may hold repeated positions, which TensorFlow adds up, so it is refused."""
        indices = node.inputs[0]
        if indices.type != "ParseExampleV2":
            raise Refusal(node.type, node.name, "it sums a sparse tensor the graph computes, which may repeat a "
                          "position", "sum the sparse feature as parsed, or densify it first (tf.sparse.to_dense)")
        if not node.inputs[3].is_const():
            raise Refusal(node.type, node.name, "its axes are computed", "give tf.sparse.reduce_sum constant axes")
        value_type = ctx.get_dtype(node.input[1])
        axes = np.asarray(node.inputs[3].get_tensor_value(as_list=False), dtype=np.int64).reshape(-1)
        keep_dims = int(bool(node.get_attr_value("keep_dims", False)))
        name, (index, values, shape), outputs = node.name, node.input[:3], node.output
        ctx.remove_node(name)
        zero = numpy_helper.from_array(np.zeros([1], helper.tensor_dtype_to_np_dtype(value_type)))
        zeros = ctx.make_node("ConstantOfShape", [shape], attr={"value": zero}, name=f"{name}/zeros").output[0]
        dense = ctx.make_node("ScatterND", [zeros, index, values], name=f"{name}/dense").output[0]
        ctx.make_node("ReduceSum", [dense, _const(ctx, f"{name}/axes", axes)], outputs=outputs,
                      attr={"keepdims": keep_dims}, name=f"{name}/sum", dtypes=[value_type])


# tf2onnx rewrites of sparse and ragged ops that divide integers by a size or a product of sizes: a batch whose
# records carry no value of a sparse or ragged feature has a width of 0 there (TensorFlow's parse gives that too).
_SIZE_DIVIDING_OPS = ("SparseReshape", "SparseFillEmptyRows", "RaggedTensorToTensor", "RaggedTensorToSparse")


def _safe_sizes(op: str):
    """tf2onnx's own handler for `op`, with each integer division or modulo it adds made safe for a zero divisor
    (taken as 1). There, a zero divisor comes with an empty dividend or an unused quotient (tf2onnx infers a -1
    dimension even where there is none), where TensorFlow does not divide at all; ONNX Runtime refuses an integer
    division by zero even of an empty tensor, which failed a whole batch of records without values."""
    from tf2onnx.onnx_opset import tensor

    original = getattr(tensor, op)

    def convert(cls, ctx, node, **kwargs):
        versions = [int(n.split("_")[1]) for n in dir(original) if n.startswith("version_")]
        handler = getattr(original, f"version_{max(v for v in versions if v <= ctx.opset)}")
        before = {n.name for n in ctx.get_nodes()}
        name = node.name
        handler(ctx, node, **kwargs)
        added = [n for n in ctx.get_nodes() if n.name not in before and n.type in ("Div", "Mod")]
        for index, division in enumerate(added):
            divisor, kind = division.input[1], ctx.get_dtype(division.input[1])
            if kind not in _ALL_INTEGERS:
                continue
            zero = _const(ctx, f"{name}/safe_{index}_zero", np.array(0, helper.tensor_dtype_to_np_dtype(kind)))
            is_zero = ctx.make_node("Equal", [divisor, zero], name=f"{name}/safe_{index}_is_zero").output[0]
            one_if_zero = ctx.make_node("Cast", [is_zero], attr={"to": kind},
                                        name=f"{name}/safe_{index}_one_if_zero").output[0]
            safe = ctx.make_node("Add", [divisor, one_if_zero], name=f"{name}/safe_{index}_divisor").output[0]
            ctx.replace_input(division, divisor, safe, 1)

    # The same versions as tf2onnx's handler, so that each of its registrations is replaced.
    versions = {name: classmethod(convert) for name in dir(original) if name.startswith("version_")}
    return type(f"SafeSizes{op}", (), versions)


def register() -> None:
    """Put these handlers in tf2onnx's registry, over its own LookupTableFindV2 handler (registered on import of
    tf2onnx.convert, so that module is imported first)."""
    import tf2onnx.convert  # noqa: F401 - registers tf2onnx's own handlers, which ours replace

    tf_op("LookupTableFindV2")(LookupTableFind)
    tf_op("Bucketize")(Bucketize)
    tf_op("FloorMod")(FloorMod)
    tf_op("SparseReduceSum")(SparseReduceSum)
    for op in _SIZE_DIVIDING_OPS:
        tf_op(op)(_safe_sizes(op))


def _take_option(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in `argv`, both removed from it (tf2onnx's own parser refuses options it does not know)."""
    if flag not in argv:
        return None
    at = argv.index(flag)
    value = argv[at + 1]
    del argv[at:at + 2]
    return value


def _convert_one(args: list[str], shapes_out: str | None) -> int:
    """One tf2onnx run with these handlers (registered already): its exit code, 3 for a refusal."""
    import json

    from tf2onnx import convert

    from s2t.atomic_files import write_atomically
    from s2t.models import example_signature

    sys.argv = ["tf2onnx.convert", *args]
    try:
        convert.main()
    except Refusal as refusal:
        print(refusal.args[0], file=sys.stderr)
        return 3
    if shapes_out is not None:
        saved_model = args[args.index("--saved-model") + 1]
        try:
            found = {"dense_shapes": example_signature.saved_model_dense_shapes(saved_model)}
        except example_signature.SignatureError as err:
            found = {"error": str(err)}
        write_atomically(Path(shapes_out), json.dumps(found))
    return 0


def main() -> None:
    """`python -m s2t.models.tf2onnx_handlers [--dense-shapes-out FILE] <tf2onnx.convert arguments>`: tf2onnx with
    these handlers. FILE receives what tf2onnx drops of the SavedModel's tf.Example parsing, its dense shapes (or
    why they cannot be read), read here where TensorFlow is loaded anyway: `s2t convert` itself never imports it.

    `python -m s2t.models.tf2onnx_handlers --jobs JOBS --results RESULTS`: many conversions with one TensorFlow
    start (convert.convert_many); JOBS holds {"jobs": [{"args", "log", "dense_shapes_out"}], "workers", "timeout_s"},
    RESULTS receives their exit codes."""
    import json

    from s2t.atomic_files import write_atomically
    from s2t.models import example_signature, forked_jobs
    from s2t.models.convert import JOBS_OPTION, RESULTS_OPTION

    argv = sys.argv[1:]
    jobs_file, results_file = _take_option(argv, JOBS_OPTION), _take_option(argv, RESULTS_OPTION)
    register()
    if jobs_file is not None:
        plan = json.loads(Path(jobs_file).read_text())
        codes = forked_jobs.run(plan["jobs"], lambda job: _convert_one(list(job["args"]), job["dense_shapes_out"]),
                                int(plan["workers"]), float(plan["timeout_s"]))
        write_atomically(Path(results_file), json.dumps(codes))
        return
    shapes_out = _take_option(argv, example_signature.DENSE_SHAPES_OPTION)
    sys.exit(_convert_one(argv, shapes_out))


if __name__ == "__main__":
    main()
