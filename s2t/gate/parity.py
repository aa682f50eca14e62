"""Row-by-row parity: the legacy SavedModel vs ONNX Runtime vs the live Triton model."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from s2t.backends.scoring.decision_policy import Thresholds
from s2t.backends.records.record_decoder import encode_columns
from s2t.models import dataset
from s2t.on_progress import OnProgress, no_progress
from s2t.gate import reference_cache
from s2t.gate.parity_report import (FP16_ATOL, LIVE_BATCH, REL_FLOOR, Comparison, ParityReport,  # noqa: F401 - also this module's interface
                                    compare)
from s2t.wire.names import PROBABILITY

DECISION_CONFIG = Path("model_repository/risk_pipeline/config.pbtxt")


def near_threshold(reference: np.ndarray, thresholds: Thresholds, band: float = FP16_ATOL) -> list[int]:
    reference = np.asarray(reference, np.float64).ravel()
    distance = np.minimum(np.abs(reference - thresholds.review), np.abs(reference - thresholds.decline))
    return np.flatnonzero(distance < band).tolist()



def legacy_scores(saved_model: Path, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Run the SavedModel's serving_default on the columns, shaped and typed as its signature says."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    signature = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    _, spec = signature.structured_input_signature
    feeds = {}
    for name, tensor_spec in spec.items():
        if name not in columns:
            raise KeyError(f"the data has no column {name!r}, an input of the SavedModel")
        col = np.asarray(columns[name])
        col = col.astype(str) if tensor_spec.dtype == tf.string else col.astype(tensor_spec.dtype.as_numpy_dtype)
        feeds[name] = tf.constant(col.reshape([-1] + [1] * (len(tensor_spec.shape) - 1)))
    outputs = signature(**feeds)
    if len(outputs) != 1:
        raise ValueError(f"the SavedModel has {len(outputs)} outputs; a risk model has one")
    return next(iter(outputs.values())).numpy().ravel()


def packed_inputs(onnx_path: Path, columns: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The columns as the scorer takes them (vocabulary indices, numbers), with the ONNX model's feature spec."""
    import onnx

    from s2t.models.convert import read_spec
    return encode_columns(read_spec(onnx.load(str(onnx_path), load_external_data=False)), columns)


def onnx_scores(onnx_path: Path, categorical: np.ndarray, numeric: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"categorical": categorical, "numeric": numeric})[0].ravel()


def float16_model(onnx_path: Path):
    """The graph with float weights and activations in float16, inputs and outputs kept as they are.

    ONNX Runtime's own converter; the shape annotations tf2onnx left are dropped first, else they keep saying
    float32 for tensors the converter made float16 and the session refuses the graph.
    """
    import onnx
    from onnxruntime.transformers import float16

    model = onnx.load(str(onnx_path), load_external_data=False)
    model.graph.ClearField("value_info")
    return float16.convert_float_to_float16(model, keep_io_types=True)


def fp16_emulation_scores(onnx_path: Path, categorical: np.ndarray, numeric: np.ndarray) -> np.ndarray:
    """FP16 arithmetic without a GPU: the float16 graph on ONNX Runtime's CPU kernels."""
    import warnings

    import onnxruntime as ort

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns for every weight it clamps into float16's range
        model = float16_model(onnx_path)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"categorical": categorical, "numeric": numeric})[0].ravel()


def live_scores(url: str, model: str, onnx_path: Path, data: dataset.Dataset, protocol: str = "http",
                on_progress: OnProgress = no_progress) -> np.ndarray:
    """Score through the live server: JSON records if the model takes `payload`, packed tensors otherwise;
    `on_progress` hears the rows scored after every batch."""
    import onnx

    from s2t.models.convert import read_spec
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    triton = client.InferenceServerClient(url)
    try:
        metadata = triton.get_model_metadata(model, as_json=True) if protocol == "grpc" else \
            triton.get_model_metadata(model)
        if [i["name"] for i in metadata["inputs"]] == ["payload"]:
            records = [json.dumps({"request_id": f"parity-{i}", "features": r}).encode()
                       for i, r in enumerate(data.records())]
            batches = [{"payload": np.array(records[i:i + LIVE_BATCH], dtype=object).reshape(-1, 1)}
                       for i in range(0, len(records), LIVE_BATCH)]
        else:
            spec = read_spec(onnx.load(str(onnx_path), load_external_data=False))
            categorical, numeric = encode_columns(spec, data.columns)
            batches = [{"categorical": categorical[i:i + LIVE_BATCH], "numeric": numeric[i:i + LIVE_BATCH]}
                       for i in range(0, len(categorical), LIVE_BATCH)]
        scores, scored, label = [], 0, f"triton {model} ({protocol})"
        on_progress(0, len(data), label)
        for batch in batches:
            inputs = []
            for name, array in batch.items():
                dtype = "BYTES" if array.dtype == object else ("INT64" if array.dtype == np.int64 else "FP32")
                inp = client.InferInput(name, list(array.shape), dtype)
                inp.set_data_from_numpy(array)
                inputs.append(inp)
            # No output filter: Triton 2.51 ensembles fail a request that asks for a subset of their outputs
            # ("unexpected deadlock", triton-inference-server/server#7482).
            result = triton.infer(model, inputs)
            scores.append(result.as_numpy(PROBABILITY).ravel())
            scored += len(scores[-1])
            on_progress(scored, len(data), label)
        return np.concatenate(scores)
    finally:
        triton.close()


def reference_scores(saved_model: Path, data_csv: Path, data: dataset.Dataset,
                     cache_dir: Path | None = None) -> np.ndarray:
    """The legacy model's scores on the data, kept under a digest of the model's files and the data (in
    $S2T_REFERENCE_CACHE if set, else in cache_dir; neither: computed each time)."""
    scores, _ = reference_cache.reference(Path(saved_model), Path(data_csv), len(data),
                                          lambda: legacy_scores(saved_model, data.columns),
                                          reference_cache.cache_dir(cache_dir))
    return scores


def run(saved_model: Path, onnx_path: Path, data_csv: Path, atol: float = 1e-5, url: str | None = None,
        model: str | None = None, protocol: str = "http", localise: bool = True,
        reference_cache: Path | None = None, thresholds: Thresholds | None = None, fp16_emulation: bool = False,
        engines: tuple[Path, ...] = (), fp16_atol: float = FP16_ATOL, url_atol: float | None = None,
        on_progress: OnProgress = no_progress) -> ParityReport:
    """Every candidate against the legacy model; FP16 candidates (emulation, FP16 engines) at `fp16_atol`.

    `url_atol` is the live model's tolerance where it serves a low-precision engine (risk_scorer_trt FP16).
    A model converted from a tf.Example signature is compared on Examples built from the CSV (example_parity).
    `on_progress` hears each side's rows scored, a stage per side.
    """
    import onnx

    from s2t.gate import example_parity
    if example_parity.example_input(onnx.load(str(onnx_path), load_external_data=False)) is not None:
        if fp16_emulation or engines:
            raise ValueError("FP16 emulation and engines are compared on German Credit columns, not on tf.Example data")
        return example_parity.run(Path(saved_model), Path(onnx_path), Path(data_csv), atol, url, model, protocol,
                                  thresholds, on_progress)
    data = dataset.load(Path(data_csv))
    rows = len(data)

    def scored_whole(label: str, score, *args):
        """A side that scores every row in one call: a stage that goes from none to all."""
        on_progress(0, rows, label)
        scores = score(*args)
        on_progress(rows, rows, label)
        return scores

    reference = scored_whole("legacy SavedModel", reference_scores, Path(saved_model), Path(data_csv), data,
                             reference_cache)
    categorical, numeric = packed_inputs(Path(onnx_path), data.columns)
    onnx_name = f"onnxruntime {Path(onnx_path).name}"
    comparisons = [compare(onnx_name, reference,
                           scored_whole(onnx_name, onnx_scores, Path(onnx_path), categorical, numeric),
                           atol, thresholds)]
    if fp16_emulation:
        emulation = "onnxruntime float16 (CPU emulation)"
        comparisons.append(compare(emulation, reference, scored_whole(
            emulation, fp16_emulation_scores, Path(onnx_path), categorical, numeric), fp16_atol, thresholds))
    if engines:
        from s2t.models import tensorrt_engine
        for engine in engines:
            precision = tensorrt_engine.engine_precision(engine)
            name = f"tensorrt {Path(engine).name} ({precision})"
            comparisons.append(compare(name, reference, scored_whole(
                name, tensorrt_engine.engine_scores, engine, categorical, numeric),
                fp16_atol if precision == "fp16" else atol, thresholds))
    if url:
        live = live_scores(url, model or "risk_pipeline", Path(onnx_path), data, protocol, on_progress)
        comparisons.append(compare(f"triton {model or 'risk_pipeline'} ({protocol})", reference, live,
                                   url_atol or atol, thresholds))
    divergence = None
    if localise and not comparisons[0].passed:
        from s2t.gate.divergence import first_divergence
        label = f"first diverging node, on the worst row ({comparisons[0].worst_row})"
        on_progress(0, 1, label)
        divergence = first_divergence(Path(saved_model), Path(onnx_path), data, comparisons[0].worst_row, atol)
        on_progress(1, 1, label)
    near = near_threshold(reference, thresholds, fp16_atol) if thresholds is not None else None
    return ParityReport(str(saved_model), atol, len(data), comparisons, divergence, near, fp16_atol)
