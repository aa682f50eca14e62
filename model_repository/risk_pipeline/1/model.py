"""risk_pipeline: legacy records -> probability and decision in one stub (decode, ONNX Runtime, thresholds)."""
import triton_python_backend_utils as pb_utils

from backends.fused_pipeline import PipelineSettings, warm_pipeline
from backends.ort_runner import ModelConfigError
from backends.triton_glue import Glue, ModelArgs, Rows
from wire.names import PAYLOAD

SETTINGS = PipelineSettings
glue = Glue(pb_utils, "risk_pipeline")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        settings = glue.settings(SETTINGS, model, ModelConfigError)
        # The scorer is a sibling in the same repository.
        self._pipeline = warm_pipeline(model.repository, settings, model.name)
        pb_utils.Logger.log_info(f"risk_pipeline keeps {settings.scorer_model} versions "
                                 f"{sorted(self._pipeline.pipelines)} warm, serves {self._pipeline.serving()}")

    @glue.batch(PAYLOAD, ravel=True)
    def execute(self, payloads):
        scored = self._pipeline.score(payloads)
        return Rows({"probability": scored.probability, "decision": scored.decision}, scored.errors)
