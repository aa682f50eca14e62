"""Python-based Triton backend: serves `platform: "onnxruntime_onnx"` models with ONNX Runtime on CPU.

Triton picks this file (`runtime: model.py`) for any model whose config names the onnxruntime platform when the
backend directory has `onnxruntime/model.py` and no native ONNX Runtime backend, so the same config runs
unchanged on the NGC image with the native backend.
"""
import triton_python_backend_utils as pb_utils

from s2t.backends.runtime.serving_errors import InvalidInput
from s2t.backends.scoring.ort_runner import CONFIG_DTYPES, ModelConfigError, OrtRunner, OrtSettings, TensorSpec
from s2t.backends.runtime.triton_glue import Glue, ModelArgs

DEFAULT_MODEL_FILENAME = "model.onnx"
SETTINGS = OrtSettings
glue = Glue(pb_utils, "onnxruntime", shown_as="onnxruntime backend")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        path = model.version_dir / (model.config.get("default_model_filename") or DEFAULT_MODEL_FILENAME)

        def specs(key):
            return [TensorSpec(t["name"], CONFIG_DTYPES[t["data_type"]]) for t in model.config.get(key, [])]

        # Not strict: the native backend this one stands in for takes more keys than ONNX Runtime's sessions here.
        self._runner = OrtRunner(path, glue.settings(SETTINGS, model, ModelConfigError, strict=False),
                                 specs("input"), specs("output"), batched=model.config.get("max_batch_size", 0) > 0)

    def finalize(self):
        glue.finalize(self)

    @glue.execute
    def execute(self, requests):
        results = self._runner.run([{s.name: glue.input(r, s.name) for s in self._runner.inputs} for r in requests])
        return [glue.error(InvalidInput(f"onnxruntime: {result}")) if isinstance(result, Exception)
                else glue.answer({s.name: out for s, out in zip(self._runner.outputs, result)}) for result in results]
