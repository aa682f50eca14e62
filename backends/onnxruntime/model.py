"""Python-based Triton backend: serves `platform: "onnxruntime_onnx"` models with ONNX Runtime on CPU.

Triton picks this file (`runtime: model.py`) for any model whose config names the onnxruntime platform when the
backend directory has `onnxruntime/model.py` and no native ONNX Runtime backend, so the same config runs
unchanged on the NGC image with the native backend.
"""
import json
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.errors import InternalError, InvalidInput, triton_error
from backends.ort_runner import CONFIG_DTYPES, OrtRunner, OrtSettings, TensorSpec

DEFAULT_MODEL_FILENAME = "model.onnx"


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        filename = config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        path = Path(args["model_repository"]) / args["model_version"] / filename

        def specs(key):
            return [TensorSpec(t["name"], CONFIG_DTYPES[t["data_type"]]) for t in config.get(key, [])]

        self._runner = OrtRunner(path, OrtSettings.from_parameters(config.get("parameters", {})),
                                 specs("input"), specs("output"), batched=config.get("max_batch_size", 0) > 0)

    def execute(self, requests):
        try:
            fault_points.check("onnxruntime.execute")
            feeds = [{s.name: pb_utils.get_input_tensor_by_name(r, s.name).as_numpy() for s in self._runner.inputs}
                     for r in requests]
            results = self._runner.run(feeds)
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            return [_error(InternalError("onnxruntime backend: internal error")) for _ in requests]
        return [self._response(result) for result in results]

    def _response(self, result):
        if isinstance(result, Exception):
            return _error(InvalidInput(f"onnxruntime: {result}"))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(s.name, out) for s, out in zip(self._runner.outputs, result)])


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
