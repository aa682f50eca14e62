"""ONNX Runtime behind Triton's config: settings from config parameters, one run per dynamic batch.

Requests of one batch are concatenated along the batch axis and run once; outputs are split back by each
request's row count. When the batched run fails, the requests are run one by one so that only the faulty
request gets the error and its batch-mates their answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from s2t.backends.runtime.model_parameters import parameter
from s2t.backends.runtime.request_rows import RequestRows

# Config data types (model_config.proto names) -> numpy dtypes, as the native backend maps them.
CONFIG_DTYPES = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
_ORT_TYPES = {
    "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32,
    "tensor(int64)": np.int64, "tensor(float16)": np.float16, "tensor(float)": np.float32,
    "tensor(double)": np.float64, "tensor(string)": np.object_,
}


class ModelConfigError(ValueError):
    """The config cannot work with the model file; Triton refuses to load the model with this message."""


def _parallel_execution_mode(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"expected 0 (sequential) or 1 (parallel), got {text!r}")
    return text == "1"


@dataclass(frozen=True)
class OrtSettings:
    """The parameter names the native onnxruntime backend reads, so one config serves both."""

    intra_op_thread_count: int = parameter("intra_op_thread_count", 0)
    inter_op_thread_count: int = parameter("inter_op_thread_count", 0)
    parallel_execution: bool = parameter("execution_mode", False, parse=_parallel_execution_mode)

    def __post_init__(self):
        for name in ("intra_op_thread_count", "inter_op_thread_count"):
            if getattr(self, name) < 0:
                raise ValueError(f"parameter {name}: must be >= 0, got {getattr(self, name)}")


    def session_options(self) -> ort.SessionOptions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.intra_op_thread_count
        options.inter_op_num_threads = self.inter_op_thread_count
        options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if self.parallel_execution
                                  else ort.ExecutionMode.ORT_SEQUENTIAL)
        return options


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: type


class OrtRunner:
    def __init__(self, model_path: Path, settings: OrtSettings, inputs: Sequence[TensorSpec],
                 outputs: Sequence[TensorSpec], batched: bool = True):
        if not Path(model_path).is_file():
            raise ModelConfigError(f"model file not found: {model_path}")
        self.session = ort.InferenceSession(str(model_path), sess_options=settings.session_options(),
                                            providers=["CPUExecutionProvider"])
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._check(self.inputs, {i.name: i.type for i in self.session.get_inputs()}, "input")
        self._check(self.outputs, {o.name: o.type for o in self.session.get_outputs()}, "output")
        self._output_names = [o.name for o in self.outputs]
        # Without a batch dimension (max_batch_size 0) requests cannot be concatenated.
        self.batched = batched

    @staticmethod
    def _check(declared: Sequence[TensorSpec], actual: Mapping[str, str], kind: str) -> None:
        for spec in declared:
            if spec.name not in actual:
                raise ModelConfigError(f"config {kind} {spec.name!r} is not in the model "
                                       f"(the model has {', '.join(sorted(actual))})")
            model_dtype = _ORT_TYPES.get(actual[spec.name])
            if model_dtype is not spec.dtype:
                raise ModelConfigError(f"config {kind} {spec.name!r} is {np.dtype(spec.dtype).name}, "
                                       f"the model says {actual[spec.name]}")

    def _feed(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {}
        for spec in self.inputs:
            array = arrays[spec.name]
            if spec.dtype is np.object_:
                # Triton hands BYTES as bytes objects; ONNX Runtime string tensors want str.
                array = np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel()],
                                 dtype=object).reshape(array.shape)
            feed[spec.name] = array
        return feed

    def run_one(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self._output_names, self._feed(arrays))

    def run(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[list[np.ndarray] | Exception]:
        """Outputs for each request, or the exception that request alone caused."""
        if len(requests) == 1 or not self.batched:
            return [self._guarded(r) for r in requests]
        rows = RequestRows.of([r[self.inputs[0].name] for r in requests])
        try:
            outputs = self.run_one({s.name: rows.join([r[s.name] for r in requests]) for s in self.inputs})
        except Exception:  # noqa: BLE001 - find the faulty request(s) below
            return [self._guarded(r) for r in requests]
        per_output = [rows.split(out) for out in outputs]
        return [[parts[i] for parts in per_output] for i in range(len(requests))]

    def _guarded(self, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray] | Exception:
        try:
            return self.run_one(arrays)
        except Exception as err:  # noqa: BLE001 - becomes this request's error
            return err
