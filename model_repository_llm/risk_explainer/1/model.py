"""risk_explainer: score a legacy record, give its reason codes, stream an explanation (or the template).

Each request is handled on a worker thread: decode (backends/record_decoder.py), score through risk_pipeline
(BLS), reason codes from the linear model (backends/reason_codes.py), then words from `llm` (BLS, decoupled) or,
when backends/degrade_policy.py says the model is too slow, the template (backends/explanation_text.py).
Responses and metric updates go to Triton from one outbox thread, as in `llm`.
"""
import json
import queue
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from backends.decoupled_sender import StreamSender
from backends.degrade_policy import DEGRADE_REASONS, LLM, LLM_ERROR, TTFT_TIMEOUT, DegradePolicy
from backends.explanation_text import explanation_prompt, template_explanation
from backends.explainer_settings import ExplainerSettings
from backends.model_parameters import read_parameters
from backends.reason_codes import LinearReasons
from backends.record_decoder import RecordDecoder, RecordError, parse_record

_END = object()


class RequestFailed(Exception):
    def __init__(self, message: str, code):
        super().__init__(message)
        self.code = code


def _tensor(name, value, dtype=object):
    return pb_utils.Tensor(name, np.array(value, dtype=dtype))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("risk_explainer streams its explanation: set model_transaction_policy { decoupled: true }")
        settings = read_parameters(ExplainerSettings, config.get("parameters", {}))
        reason_model = Path(args["model_repository"]) / args["model_version"] / settings.reason_model
        if not reason_model.is_file():
            raise ValueError(f"reason_model: no ONNX file at {reason_model} (`make models` writes it)")
        self._reasons = LinearReasons(reason_model, settings.top_reasons)
        self._decoder = RecordDecoder(self._reasons.spec, settings.max_record_bytes)
        self._scoring_model = settings.scoring_model
        self._llm_model = settings.llm_model
        self._max_tokens = settings.max_tokens
        self._policy = DegradePolicy(settings.degrade_ttft_s, settings.probe_interval_s)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        family = pb_utils.MetricFamily
        # The families must outlive their metrics.
        self._families = [family("s2t_explainer_requests_total", "explanations by source", family.COUNTER),
                          family("s2t_explainer_degraded_total", "explanations answered by the template instead of "
                                 "the language model, by reason", family.COUNTER)]
        self._answered = {source: self._families[0].Metric(labels={**labels, "source": source})
                          for source in ("llm", "template", "error")}
        self._degraded = {reason: self._families[1].Metric(labels={**labels, "reason": reason})
                          for reason in DEGRADE_REASONS}
        self._outbox = queue.SimpleQueue()
        self._outbox_thread = threading.Thread(target=self._outbox_loop, name="explainer-outbox", daemon=True)
        self._outbox_thread.start()
        self._workers = ThreadPoolExecutor(settings.workers, thread_name_prefix="explainer")

    def execute(self, requests):
        for request in requests:
            sender = StreamSender(request.get_response_sender(), pb_utils)
            self._workers.submit(self._handle, request, sender)
        return None

    def finalize(self):
        self._workers.shutdown(wait=True)
        self._outbox.put(None)
        self._outbox_thread.join(timeout=5)

    def _outbox_loop(self):
        while (task := self._outbox.get()) is not None:
            try:
                task()
            except Exception:  # noqa: BLE001 - one failed send must not stop the others
                pb_utils.Logger.log_error(traceback.format_exc())

    def _post(self, task):
        self._outbox.put(task)

    def _handle(self, request, sender):
        try:
            self._explain(request, sender)
        except RequestFailed as err:
            # Bound now: `err` is unset once the except block ends, before the outbox runs the task.
            self._post(lambda message=str(err), code=err.code: (sender.fail(message, code),
                                                                self._answered["error"].increment(1)))
        except Exception:  # noqa: BLE001 - log it; the client gets a plain message and its final answer
            pb_utils.Logger.log_error(traceback.format_exc())
            self._post(lambda: (sender.fail("risk_explainer: internal error", pb_utils.TritonError.INTERNAL),
                                self._answered["error"].increment(1)))

    def _explain(self, request, sender):
        payloads = pb_utils.get_input_tensor_by_name(request, "payload").as_numpy().ravel()
        if len(payloads) != 1:
            raise RequestFailed(f"payload: one record per request, got {len(payloads)}",
                                pb_utils.TritonError.INVALID_ARG)
        try:
            record = parse_record(payloads[0], self._decoder.max_record_bytes)
        except RecordError as err:
            raise RequestFailed(str(err), pb_utils.TritonError.INVALID_ARG) from None
        decoded = self._decoder.decode([payloads[0]])
        if decoded.errors[0] is not None:
            raise RequestFailed(str(decoded.errors[0]), pb_utils.TritonError.INVALID_ARG)
        probability, decision = self._score(payloads[0])
        reasons = self._reasons.explain(decoded.categorical, decoded.numeric)[0].reasons
        head = [_tensor("reasons", [r.code().encode() for r in reasons]),
                _tensor("probability", [probability], np.float32), _tensor("decision", [decision.encode()]),
                _tensor("text_output", [b""])]
        self._post(lambda: sender.send(head))
        if self._policy.route(time.monotonic()) == LLM:
            prompt = explanation_prompt(decision, probability, reasons, record.features)
            if self._stream_llm(prompt, sender):
                return
        else:
            self._post(lambda: self._degraded["expected_ttft"].increment(1))
        text = template_explanation(decision, probability, reasons, record.features)
        self._post(lambda: (sender.finish([_tensor("text_output", [text.encode()]),
                                           _tensor("source", [b"template"])]),
                            self._answered["template"].increment(1)))

    def _score(self, payload: bytes) -> tuple[float, str]:
        response = pb_utils.InferenceRequest(
            model_name=self._scoring_model, requested_output_names=["probability", "decision"],
            inputs=[pb_utils.Tensor("payload", np.array([[payload]], dtype=object))]).exec()
        if response.has_error():
            raise RequestFailed(f"{self._scoring_model}: {response.error().message()}", response.error().code())
        probability = float(pb_utils.get_output_tensor_by_name(response, "probability").as_numpy().ravel()[0])
        decision = pb_utils.get_output_tensor_by_name(response, "decision").as_numpy().ravel()[0]
        return probability, decision.decode() if isinstance(decision, bytes) else str(decision)

    def _stream_llm(self, prompt: str, sender) -> bool:
        """Stream the model's words; False (nothing sent) when it fails or misses the first-token deadline."""
        tokens = queue.SimpleQueue()
        started = time.monotonic()

        def pump():
            try:
                responses = pb_utils.InferenceRequest(
                    model_name=self._llm_model, requested_output_names=["text_output"],
                    inputs=[pb_utils.Tensor("text_input", np.array([prompt.encode()], dtype=object)),
                            pb_utils.Tensor("max_tokens", np.array([self._max_tokens], dtype=np.int32))],
                ).exec(decoupled=True)
                for response in responses:
                    if response.has_error():
                        tokens.put(RuntimeError(response.error().message()))
                        return
                    output = pb_utils.get_output_tensor_by_name(response, "text_output")
                    if output is not None:
                        text = output.as_numpy().ravel()[0]
                        if text:
                            tokens.put(text.decode() if isinstance(text, bytes) else str(text))
            except Exception as err:  # noqa: BLE001 - handed to the waiting request, which degrades
                tokens.put(err)
            finally:
                tokens.put(_END)

        threading.Thread(target=pump, name="explainer-llm", daemon=True).start()
        try:
            first = tokens.get(timeout=self._policy.threshold_s)
        except queue.Empty:
            # The stream goes on in the background and is dropped (Triton 2.51's BLS cannot cancel it).
            self._policy.timed_out(time.monotonic() - started)
            self._post(lambda: self._degraded[TTFT_TIMEOUT].increment(1))
            return False
        if first is _END or isinstance(first, Exception):
            pb_utils.Logger.log_warn(f"risk_explainer: {self._llm_model} failed: {first}")
            self._post(lambda: self._degraded[LLM_ERROR].increment(1))
            return False
        self._policy.first_token(time.monotonic() - started)
        text = first
        while text is not _END:
            if isinstance(text, Exception):
                pb_utils.Logger.log_warn(f"risk_explainer: {self._llm_model} failed mid-stream: {text}")
                break
            self._post(lambda t=text: sender.send([_tensor("text_output", [t.encode()])]))
            text = tokens.get()
        self._post(lambda: (sender.finish([_tensor("source", [b"llm"])]), self._answered["llm"].increment(1)))
        return True
