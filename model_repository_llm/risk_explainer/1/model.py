"""risk_explainer: score a legacy record, give its reason codes, stream an explanation (or the template).

Each request is handled on a worker thread by backends/llm/explainer.py; this file gives it the two BLS calls (the
scoring model, and the language model as a decoupled stream) and Triton's tensors. Responses and metric updates go
to Triton from one outbox thread, as in `llm`. Errors, the catch-all and the senders:
backends/runtime/triton_glue.py.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from s2t.backends.llm.explainer import Explainer, ExplainerMetrics, ExplainerSettings
from s2t.backends.scoring.reason_codes import LinearReasons
from s2t.backends.runtime.triton_glue import Glue, ModelArgs
from s2t.wire.names import DECISION, PAYLOAD, PROBABILITY

SETTINGS = ExplainerSettings
glue = Glue(pb_utils, "risk_explainer")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        glue.require_decoupled(model, "streams its explanation")
        settings = self._settings = glue.settings(SETTINGS, model)
        if not settings.reason_model.is_file():
            raise ValueError(f"reason_model: no ONNX file at {settings.reason_model} (`make models` writes it)")
        self._outbox = glue.outbox()
        metrics = ExplainerMetrics(glue.metric_family, {"model": model.name, "version": model.version})
        self._explainer = Explainer(settings, LinearReasons(settings.reason_model, settings.top_reasons), self._score,
                                    self._llm_tokens, self._outbox, metrics, pb_utils.Tensor,
                                    pb_utils.Logger.log_warn, pb_utils.Logger.log_error)
        self._workers = ThreadPoolExecutor(settings.workers, thread_name_prefix="explainer")

    def _refuse(self, sender, err):
        self._explainer.refuse(sender, err)

    @glue.each_stream(refuse=_refuse)
    def execute(self, request, sender):
        self._workers.submit(self._explainer.handle, glue.input(request, PAYLOAD).ravel(), sender)

    def finalize(self):
        self._workers.shutdown(wait=True)
        self._outbox.close()
        glue.finalize(self)

    def _score(self, payload: bytes):
        return glue.infer(self._settings.scoring_model, {PAYLOAD: np.array([[payload]], dtype=object)},
                          [PROBABILITY, DECISION])

    def _llm_tokens(self, prompt: str):
        inputs = {"text_input": np.array([prompt.encode()], dtype=object),
                  "max_tokens": np.array([self._settings.max_tokens], dtype=np.int32)}
        return (text for (text,) in glue.stream(self._settings.llm_model, inputs, ["text_output"]) if text is not None)
