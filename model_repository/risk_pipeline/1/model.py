"""risk_pipeline: legacy records -> probability and decision (decode, ONNX Runtime, thresholds).

Two ways to run it, chosen by one line of its config: `backend: "s2t_inprocess"` runs `InProcessModel` inside the
server process (backends/runtime/inprocess.py), the fast path; `backend: "python"` runs `TritonPythonModel` in a
stub
process of its own, so that a crash or a hang of the model's code costs this model, not the server, for a share
of the throughput (docs/reliability.md, "The in-process trade").
"""
from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
from s2t.backends.runtime.inprocess import InProcessGlue
from s2t.backends.scoring.ort_runner import ModelConfigError
from s2t.backends.runtime.triton_glue import ModelArgs, Rows
from s2t.wire.names import PAYLOAD

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # the in-process backend's interpreter: no stub, so only InProcessModel is served
    pb_utils = None

SETTINGS = PipelineSettings
glue = InProcessGlue("risk_pipeline")


class Pipeline:
    """What both backends serve: the pipeline warm from the config, each batch's records scored."""

    def __init__(self, model: ModelArgs, settings: PipelineSettings, log_info):
        # The scorer is a sibling in the same repository.
        self._pipeline = warm_pipeline(model.repository, settings, model.name)
        log_info(f"risk_pipeline keeps {settings.scorer_model} versions {sorted(self._pipeline.pipelines)} "
                 f"warm, serves {self._pipeline.serving()}")

    def score(self, payloads) -> Rows:
        scored = self._pipeline.score(payloads)
        return Rows({"probability": scored.probability, "decision": scored.decision}, scored.errors)


class InProcessModel:
    INPUTS = (PAYLOAD,)

    def __init__(self, model: ModelArgs):
        self._pipeline = Pipeline(model, glue.settings(SETTINGS, model, ModelConfigError), glue.log_info)

    def execute(self, payloads):
        return self._pipeline.score(payloads)


if pb_utils is not None:
    from s2t.backends.runtime.triton_glue import Glue

    stub_glue = Glue(pb_utils, "risk_pipeline")

    class TritonPythonModel:
        def initialize(self, args):
            model = ModelArgs.of(args)
            self._pipeline = Pipeline(model, stub_glue.settings(SETTINGS, model, ModelConfigError),
                                      pb_utils.Logger.log_info)

        def finalize(self):
            stub_glue.finalize(self)

        @stub_glue.batch(PAYLOAD, ravel=True)
        def execute(self, payloads):
            return self._pipeline.score(payloads)
