"""risk_pipeline: legacy records -> probability and decision (decode, ONNX Runtime, thresholds), run inside the
server process by the in-process backend (backends/inprocess.py)."""
from backends.fused_pipeline import PipelineSettings, warm_pipeline
from backends.inprocess import InProcessGlue
from backends.ort_runner import ModelConfigError
from backends.triton_glue import ModelArgs, Rows
from wire.names import PAYLOAD

SETTINGS = PipelineSettings
glue = InProcessGlue("risk_pipeline")


class InProcessModel:
    INPUTS = (PAYLOAD,)

    def __init__(self, model: ModelArgs):
        settings = glue.settings(SETTINGS, model, ModelConfigError)
        # The scorer is a sibling in the same repository.
        self._pipeline = warm_pipeline(model.repository, settings, model.name)
        glue.log_info(f"risk_pipeline keeps {settings.scorer_model} versions {sorted(self._pipeline.pipelines)} "
                      f"warm, serves {self._pipeline.serving()}")

    def execute(self, payloads):
        scored = self._pipeline.score(payloads)
        return Rows({"probability": scored.probability, "decision": scored.decision}, scored.errors)
