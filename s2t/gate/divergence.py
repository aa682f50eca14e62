"""Find the first ONNX node whose output leaves the legacy TF graph's, as Polygraphy does layer by layer.

tf2onnx names each ONNX tensor after the TF tensor it came from (`.../hidden_1/MatMul:0`), so both graphs
can run with every intermediate exposed and be compared name by name. The TF side is the frozen graph
tf2onnx itself converts, not the SavedModel's function graph: only there do the names match.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from s2t.backends.records.record_decoder import encode_columns
from s2t.models.dataset import Dataset

# Rows on each side of the worst row: a small batch catches batch-dependent bugs a single row would hide.
NEIGHBOURS = 2


def first_divergence(saved_model: Path, onnx_path: Path, data: Dataset, row: int, atol: float) -> dict | None:
    """The first node, in the ONNX graph's topological order, whose output is off by more than atol.

    Its inputs, where TF has them, still matched, so the node itself (or the weights it reads) is the suspect.
    `compared_tensors` counts the tensors compared up to and including that one. Tensors with no TF
    counterpart or a different shape are skipped. None when every compared tensor, the output included, agrees.
    """
    import onnx

    from s2t.models.convert import read_spec

    rows = np.arange(max(0, row - NEIGHBOURS), min(len(data), row + NEIGHBOURS + 1))
    columns = data.take(rows).columns
    model = onnx.load(str(onnx_path))
    categorical, numeric = encode_columns(read_spec(model), columns)
    candidate = _onnx_tensors(model, {"categorical": categorical, "numeric": numeric})
    reference = _tf_tensors(Path(saved_model), columns, list(candidate),
                            [o.name for o in model.graph.output])

    compared = 0
    for node in model.graph.node:
        for name in node.output:
            ours, theirs = candidate.get(name), reference.get(name)
            if ours is None or theirs is None or ours.shape != theirs.shape:
                continue
            compared += 1
            diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
            diff[np.isnan(diff)] = np.inf
            worst = float(diff.max(initial=0.0))
            if worst > atol:
                return {"node": node.name, "op": node.op_type, "tensor": name, "max_abs": worst,
                        "compared_tensors": compared}
    return None


def _onnx_tensors(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every typed node output, made a graph output so that ONNX Runtime neither fuses nor frees it."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(exposed)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    present = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name not in present and types.get(name, TensorProto.UNDEFINED) not in (TensorProto.UNDEFINED,
                                                                                      TensorProto.STRING):
                exposed.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
                present.add(name)
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _tf_name(onnx_name: str, signature_outputs: dict[str, str]) -> str:
    """Undo the renames made at the graph's edges; inside it, tf2onnx kept TF's "op:port" names."""
    if onnx_name in signature_outputs:
        return signature_outputs[onnx_name]
    # The unpacked numeric columns took the signature input names: the TF placeholders' names minus the port.
    return onnx_name if ":" in onnx_name else f"{onnx_name}:0"


def _tf_tensors(saved_model: Path, columns: dict[str, np.ndarray], onnx_names: list[str],
                onnx_outputs: list[str]) -> dict[str, np.ndarray]:
    """TF values keyed by ONNX tensor name, for those of `onnx_names` the frozen graph has and can compute."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tf2onnx import tf_loader

    graph_def, inputs, outputs, tables, renamed = tf_loader.from_saved_model(
        str(saved_model), None, None, tag="serve", signatures=["serving_default"],
        return_initialized_tables=True, return_tensors_to_rename=True)
    # convert.py renamed the signature's output (output_0, the frozen graph's Identity:0) to `probability`;
    # both sides list their outputs in the same order.
    signature_outputs = dict(zip(onnx_outputs, outputs))

    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        # The frozen graph keeps the hash tables but not their initialisers; tf2onnx exported the contents.
        imports = []
        for op in graph.get_operations():
            contents = tables.get(op.get_attr("shared_name")) if op.type == "HashTableV2" else None
            if contents is not None:
                imports.append(tf.raw_ops.LookupTableImportV2(table_handle=op.outputs[0], keys=contents[0],
                                                              values=contents[1]))
        feeds = {}
        for tensor_name in inputs:
            placeholder = graph.get_tensor_by_name(tensor_name)
            column = np.asarray(columns[renamed.get(tensor_name, tensor_name.split(":")[0])])
            if placeholder.dtype == tf.string:
                column = np.array([str(v).encode() for v in column], dtype=object)
            else:
                column = column.astype(placeholder.dtype.as_numpy_dtype)
            feeds[placeholder] = column.reshape([-1] + [1] * ((placeholder.shape.rank or 2) - 1))
        fetches = {}
        for onnx_name in onnx_names:
            try:
                tensor = graph.get_tensor_by_name(_tf_name(onnx_name, signature_outputs))
            except (KeyError, ValueError):
                continue
            if tensor.dtype not in (tf.string, tf.resource, tf.variant) and graph.is_fetchable(tensor):
                fetches[onnx_name] = tensor
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(imports)
            try:
                return session.run(fetches, feeds)
            except tf.errors.OpError:
                return _fetch_one_by_one(session, fetches, feeds)


def _fetch_one_by_one(session, fetches: dict, feeds: dict) -> dict[str, np.ndarray]:
    """Only when fetching all at once fails: one tensor TF cannot compute must not hide the others."""
    import tensorflow as tf

    values = {}
    for name, tensor in fetches.items():
        try:
            values[name] = session.run(tensor, feeds)
        except tf.errors.OpError:
            pass
    return values
