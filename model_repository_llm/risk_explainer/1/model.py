"""risk_explainer: score a legacy record, give its reason codes, stream an explanation (or the template).

Each request is handled on a worker thread by backends/explainer.py; this file gives it the two BLS calls (the
scoring model, and the language model as a decoupled stream) and Triton's tensors. Responses and metric updates go
to Triton from one outbox thread, as in `llm`.
"""
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from backends.decoupled_sender import Outbox, StreamSender
from backends.explainer import Explainer, ExplainerMetrics, ExplainerSettings, RequestFailed, TritonCodes
from backends.model_parameters import read_parameters
from backends.reason_codes import LinearReasons
from wire.names import DECISION, PAYLOAD, PROBABILITY


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("risk_explainer streams its explanation: set model_transaction_policy { decoupled: true }")
        settings = read_parameters(ExplainerSettings, config.get("parameters", {}))
        reason_model = Path(args["model_repository"]) / args["model_version"] / settings.reason_model
        if not reason_model.is_file():
            raise ValueError(f"reason_model: no ONNX file at {reason_model} (`make models` writes it)")
        self._settings = settings
        self._outbox = Outbox(pb_utils.Logger.log_error, "explainer-outbox")
        metrics = ExplainerMetrics(pb_utils.MetricFamily, {"model": args["model_name"],
                                                            "version": args["model_version"]})
        self._explainer = Explainer(
            settings, LinearReasons(reason_model, settings.top_reasons), self._score, self._llm_tokens, self._outbox,
            metrics, pb_utils.Tensor, TritonCodes(pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.INTERNAL,
                                                pb_utils.TritonError.UNAVAILABLE),
            pb_utils.Logger.log_warn, pb_utils.Logger.log_error)
        self._workers = ThreadPoolExecutor(settings.workers, thread_name_prefix="explainer")

    def execute(self, requests):
        for request in requests:
            sender = StreamSender(request.get_response_sender(), pb_utils)
            payloads = pb_utils.get_input_tensor_by_name(request, PAYLOAD).as_numpy().ravel()
            self._workers.submit(self._explainer.handle, payloads, sender)
        return None

    def finalize(self):
        self._workers.shutdown(wait=True)
        self._outbox.close()

    def _score(self, payload: bytes) -> tuple[float, str]:
        model = self._settings.scoring_model
        response = pb_utils.InferenceRequest(
            model_name=model, requested_output_names=[PROBABILITY, DECISION],
            inputs=[pb_utils.Tensor(PAYLOAD, np.array([[payload]], dtype=object))]).exec()
        if response.has_error():
            raise RequestFailed(f"{model}: {response.error().message()}", response.error().code())
        probability = float(pb_utils.get_output_tensor_by_name(response, PROBABILITY).as_numpy().ravel()[0])
        decision = pb_utils.get_output_tensor_by_name(response, DECISION).as_numpy().ravel()[0]
        return probability, decision.decode() if isinstance(decision, bytes) else str(decision)

    def _llm_tokens(self, prompt: str):
        responses = pb_utils.InferenceRequest(
            model_name=self._settings.llm_model, requested_output_names=["text_output"],
            inputs=[pb_utils.Tensor("text_input", np.array([prompt.encode()], dtype=object)),
                    pb_utils.Tensor("max_tokens", np.array([self._settings.max_tokens], dtype=np.int32))],
        ).exec(decoupled=True)
        for response in responses:
            if response.has_error():
                raise RuntimeError(response.error().message())
            output = pb_utils.get_output_tensor_by_name(response, "text_output")
            if output is not None:
                text = output.as_numpy().ravel()[0]
                if text:
                    yield text.decode() if isinstance(text, bytes) else str(text)
