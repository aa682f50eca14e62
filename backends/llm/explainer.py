"""risk_explainer's work on one request, without Triton: decode the record, score it, give its reason codes, then
stream the language model's words, or the template when backends/llm/degrade_policy.py says the model is too slow.

The scoring model and the language model are callables (BLS in the model, through backends/runtime/triton_glue.py),
the
response sender is a StreamSender and every send goes through the outbox. A request's failure is a ServingError
(backends/runtime/serving_errors.py), whose kind gives its Triton code. `tensor(name, array)` is pb_utils.Tensor.
Nothing here
imports Triton.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from s2t.backends.runtime.decoupled_sender import Outbox, StreamSender
from s2t.backends.llm.degrade_policy import DEGRADE_REASONS, EXPECTED_TTFT, LLM, LLM_ERROR, TTFT_TIMEOUT, DegradePolicy
from s2t.backends.runtime.serving_errors import InternalError, InvalidInput, ServingError, Unavailable
from s2t.backends.llm.explanation_text import explanation_prompt, template_explanation
from s2t.backends.runtime.model_parameters import VERSION_FOLDER, parameter, path_parameter, positive_integer
from s2t.backends.scoring.reason_codes import LinearReasons
from s2t.backends.records.record_decoder import RecordDecoder, RecordError, max_record_bytes_parameter, parse_record

SOURCES = ("llm", "template", "error")
_END = object()
# Language-model streams given up on (Triton 2.51's BLS cannot cancel them) that may still hold a thread, per worker:
# beyond this the explainer answers with the template without asking the model, so a dead model leaks nothing more.
ABANDONED_PER_WORKER = 4


@dataclass(frozen=True)
class ExplainerSettings:
    reason_model: Path = path_parameter("reason_model", Path("reason_model.onnx"), within=VERSION_FOLDER)
    top_reasons: int = parameter("top_reasons", 3, parse=positive_integer)
    max_record_bytes: int = max_record_bytes_parameter()
    scoring_model: str = parameter("scoring_model", "risk_pipeline")
    # llm's canary router, so explanations follow the split between llm's versions (it relays llm's outputs).
    llm_model: str = parameter("llm_model", "llm_router")
    max_tokens: int = parameter("max_tokens", 48, parse=positive_integer)
    degrade_ttft_s: float = parameter("degrade_ttft_s", 1.0)
    probe_interval_s: float = parameter("probe_interval_s", 5.0)
    workers: int = parameter("workers", 4, parse=positive_integer)
    # The longest wait for the language model's next word once it has started (its words come every ~20-100 ms):
    # a model that dies mid-answer costs each stream at most this long, never its worker for good.
    token_timeout_s: float = parameter("token_timeout_s", 5.0)

    def __post_init__(self):
        if not self.token_timeout_s > 0:
            raise ValueError(f"token_timeout_s must be > 0, got {self.token_timeout_s}")


class ExplainerMetrics:
    """`s2t_explainer_requests_total{source}` and `s2t_explainer_degraded_total{reason}`."""

    def __init__(self, metric_family, labels: dict[str, str]):
        # The families must outlive their metrics.
        self._families = [metric_family("s2t_explainer_requests_total", "explanations by source",
                                        metric_family.COUNTER),
                          metric_family("s2t_explainer_degraded_total", "explanations answered by the template "
                                        "instead of the language model, by reason", metric_family.COUNTER)]
        self.answered = {source: self._families[0].Metric(labels={**labels, "source": source}) for source in SOURCES}
        self.degraded = {reason: self._families[1].Metric(labels={**labels, "reason": reason})
                         for reason in DEGRADE_REASONS}


class Explainer:
    def __init__(self, settings: ExplainerSettings, reasons: LinearReasons,
                 score: Callable[[bytes], tuple], llm_tokens: Callable[[str], Iterator],
                 outbox: Outbox, metrics: ExplainerMetrics, tensor: Callable,
                 log_warn: Callable[[str], None], log_error: Callable[[str], None]):
        """`score(payload)` -> (probability, decision) as one-value arrays, raising a ServingError;
        `llm_tokens(prompt)` yields the language model's text pieces (one-value arrays), raising on its failure."""
        self.settings, self.reasons, self.score, self.llm_tokens = settings, reasons, score, llm_tokens
        self.decoder = RecordDecoder(reasons.spec, settings.max_record_bytes)
        self.policy = DegradePolicy(settings.degrade_ttft_s, settings.probe_interval_s)
        self.outbox, self.metrics, self.tensor = outbox, metrics, tensor
        self.log_warn, self.log_error = log_warn, log_error
        self._pumps = threading.BoundedSemaphore(settings.workers * (1 + ABANDONED_PER_WORKER))

    def _array(self, name, value, dtype=object):
        return self.tensor(name, np.array(value, dtype=dtype))

    def handle(self, payloads: np.ndarray, sender: StreamSender) -> None:
        """Answer one request completely (on a worker thread); its final response always goes out."""
        try:
            self._explain(payloads, sender)
        except ServingError as err:
            self.refuse(sender, err)
        except Exception:  # noqa: BLE001 - log it; the client gets a plain message and its final answer
            self.log_error(traceback.format_exc())
            self.refuse(sender, InternalError("risk_explainer: internal error"))

    def refuse(self, sender: StreamSender, err: ServingError) -> None:
        """The request's final answer is `err` (sent by the outbox, counted as an error)."""
        self.outbox.put(lambda: (sender.refuse(err), self.metrics.answered["error"].increment(1)))

    def _explain(self, payloads: np.ndarray, sender: StreamSender) -> None:
        post = self.outbox.put
        if len(payloads) != 1:
            raise InvalidInput(f"payload: one record per request, got {len(payloads)}")
        try:
            record = parse_record(payloads[0], self.decoder.max_record_bytes)
        except RecordError as err:
            raise InvalidInput(str(err)) from None
        decoded = self.decoder.decode([payloads[0]])
        if decoded.errors[0] is not None:
            raise InvalidInput(str(decoded.errors[0]))
        probability, decision = self.score(payloads[0])
        probability, decision = float(np.ravel(probability)[0]), _text(np.ravel(decision)[0])
        reasons = self.reasons.explain(decoded.categorical, decoded.numeric)[0].reasons
        head = [self._array("reasons", [r.code().encode() for r in reasons]),
                self._array("probability", [probability], np.float32), self._array("decision", [decision.encode()]),
                self._array("text_output", [b""])]
        post(lambda: sender.send(head))
        if self.policy.route(time.monotonic()) == LLM:
            prompt = explanation_prompt(decision, probability, reasons, record.features)
            if self._stream_llm(prompt, sender):
                return
        else:
            post(lambda: self.metrics.degraded[EXPECTED_TTFT].increment(1))
        text = template_explanation(decision, probability, reasons, record.features)
        final = [self._array("text_output", [text.encode()]), self._array("source", [b"template"])]
        post(lambda: (sender.finish(final), self.metrics.answered["template"].increment(1)))

    def _stream_llm(self, prompt: str, sender: StreamSender) -> bool:
        """Stream the model's words; False (nothing sent) when it fails or misses the first-token deadline."""
        post, model = self.outbox.put, self.settings.llm_model
        tokens: queue.SimpleQueue = queue.SimpleQueue()
        started = time.monotonic()
        if not self._pumps.acquire(blocking=False):
            self.log_warn(f"risk_explainer: too many {model} streams left unanswered; answering with the template")
            post(lambda: self.metrics.degraded[LLM_ERROR].increment(1))
            return False

        def pump():
            try:
                for piece in self.llm_tokens(prompt):
                    if (text := _text(np.ravel(piece)[0])):
                        tokens.put(text)
            except Exception as err:  # noqa: BLE001 - handed to the waiting request, which degrades
                tokens.put(err)
            finally:
                tokens.put(_END)
                self._pumps.release()

        threading.Thread(target=pump, name="explainer-llm", daemon=True).start()
        try:
            first = tokens.get(timeout=self.policy.threshold_s)
        except queue.Empty:
            # The stream goes on in the background and is dropped (Triton 2.51's BLS cannot cancel it).
            self.policy.timed_out(time.monotonic() - started)
            post(lambda: self.metrics.degraded[TTFT_TIMEOUT].increment(1))
            return False
        if first is _END or isinstance(first, Exception):
            self.log_warn(f"risk_explainer: {model} failed: {first}")
            post(lambda: self.metrics.degraded[LLM_ERROR].increment(1))
            return False
        self.policy.first_token(time.monotonic() - started)
        text = first
        while text is not _END:
            if isinstance(text, Exception):
                self._stopped_mid_answer(sender, f"failed ({text})")
                return True
            post(lambda t=text: sender.send([self._array("text_output", [t.encode()])]))
            try:
                text = tokens.get(timeout=self.settings.token_timeout_s)
            except queue.Empty:
                # The stream is dropped (BLS cannot cancel it); its pump ends when the model's stream does.
                self._stopped_mid_answer(sender, f"sent no word for {self.settings.token_timeout_s:g} s")
                return True
        post(lambda: (sender.finish([self._array("source", [b"llm"])]), self.metrics.answered["llm"].increment(1)))
        return True

    def _stopped_mid_answer(self, sender: StreamSender, what: str) -> None:
        """The model's words already went out: the template cannot follow them, so the stream ends with an error
        that says the score and reasons sent first stand."""
        message = (f"risk_explainer: the language model {self.settings.llm_model} {what} mid-explanation; the "
                   "score and reasons sent first stand")
        self.log_warn(message)
        self.outbox.put(lambda: (sender.refuse(Unavailable(message)), self.metrics.answered["error"].increment(1),
                                 self.metrics.degraded[LLM_ERROR].increment(1)))


def _text(value) -> str:
    """One value of a BYTES tensor as text."""
    return value.decode() if isinstance(value, bytes) else str(value)
