"""risk_stream: records of many streams in, each stream's answers out strictly in sequence_id order, once each.

Decoupled with the sequence batcher (correlation id = stream). This file only turns Triton requests into
arrivals and answers into responses; what each request gets is decided in backends/stream_session.py (scoring by
one BLS call to the scoring model per batch, reorder buffers, an answer for every id). A timer thread gives up
missing ids after reorder_timeout_ms and evicts idle streams.
"""
import json
import threading
import time
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.batch_scoring import retrying
from backends.errors import InternalError, InvalidInput, from_triton_code, triton_error
from backends.model_parameters import read_parameters
from backends.stream_session import Arrival, StreamModelSettings, StreamSession

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Checked at least this often for idle streams, even when no record waits.
IDLE_CHECK_SECONDS = 1.0
COUNTERS = {
    "reordered": "records that arrived ahead of a missing id and waited in a reorder buffer",
    "duplicate": "records answered DUPLICATE: their sequence_id was already answered or waiting",
    "stale": "records refused because their sequence_id is below the first id of their stream",
    "late": "records answered LATE: their sequence_id had already been given up as GAP",
    "gap": "sequence ids given up (answered GAP)",
    "overflow": "records refused because their stream's reorder buffer was full",
    "evicted": "idle streams evicted",
}


def _flag(request, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().ravel()[0])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("risk_stream answers records when their turn comes: its config must set "
                             "model_transaction_policy { decoupled: true }")
        settings = read_parameters(StreamModelSettings, config.get("parameters", {}))
        self._scoring_model = settings.scoring_model
        self._session = StreamSession(settings.reorder, retrying(self._score), self._deliver,
                                      settings.max_record_bytes, log=pb_utils.Logger.log_error)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self._families = {name: pb_utils.MetricFamily(f"s2t_stream_{name}_total", text, pb_utils.MetricFamily.COUNTER)
                          for name, text in COUNTERS.items()}
        self._families["buffered"] = pb_utils.MetricFamily(
            "s2t_stream_buffered", "records waiting in reorder buffers", pb_utils.MetricFamily.GAUGE)
        self._families["streams"] = pb_utils.MetricFamily(
            "s2t_stream_streams", "streams with reorder state", pb_utils.MetricFamily.GAUGE)
        self._families["undelivered"] = pb_utils.MetricFamily(
            "s2t_stream_delivery_failures_total", "answers that could not be sent (an error was sent instead)",
            pb_utils.MetricFamily.COUNTER)
        self._metrics = {name: family.Metric(labels=labels) for name, family in self._families.items()}
        self._reported = {name: 0 for name in (*COUNTERS, "undelivered")}
        # execute and the timer both report; the increments must not be counted twice.
        self._report_lock = threading.Lock()
        self._timer = threading.Thread(target=self._expire_loop, name="risk_stream-expire", daemon=True)
        self._timer.start()

    def execute(self, requests):
        senders = [r.get_response_sender() for r in requests]
        try:
            fault_points.check("risk_stream.execute")
            arrivals = [self._arrival(r, s) for r, s in zip(requests, senders)]
        except Exception:  # noqa: BLE001 - log it; every request gets its final answer
            pb_utils.Logger.log_error(traceback.format_exc())
            for sender in senders:
                sender.send(_error(InternalError("risk_stream: internal error")), flags=FINAL)
            return None
        try:
            waiting = self._session.arrive(arrivals)
        except Exception:  # noqa: BLE001 - before any record was taken in (decoding or scoring): answer them all
            pb_utils.Logger.log_error(traceback.format_exc())
            for sender in senders:
                sender.send(_error(InternalError("risk_stream: internal error")), flags=FINAL)
            return None
        # The timer sleeps until the earliest reorder deadline; only a record that now waits can bring that
        # deadline forward, so only then is it woken (otherwise it rescans every stream for nothing).
        if waiting:
            self._wake.set()
        self._report()
        return None

    def finalize(self):
        self._stopping.set()
        self._wake.set()
        self._timer.join(timeout=5)
        self._session.close()

    @staticmethod
    def _arrival(request, sender) -> Arrival:
        stream, start, end = str(request.correlation_id()), _flag(request, "START"), _flag(request, "END")
        payloads = pb_utils.get_input_tensor_by_name(request, "payload").as_numpy().ravel()
        if len(payloads) != 1:
            return Arrival(sender, stream, start, end, error=InvalidInput(
                f"payload: a stream request carries one record, got {len(payloads)}"))
        return Arrival(sender, stream, start, end, payload=payloads[0])

    def _score(self, payloads):
        request = pb_utils.InferenceRequest(
            model_name=self._scoring_model, requested_output_names=["probability", "decision"],
            inputs=[pb_utils.Tensor("payload", np.array(payloads, dtype=object).reshape(-1, 1))])
        try:
            response = request.exec()
        except Exception:  # noqa: BLE001 - the stub's own failure: log it, answer the records with an error
            pb_utils.Logger.log_error(traceback.format_exc())
            raise InternalError("risk_stream: internal error while scoring") from None
        if response.has_error():
            error = response.error()
            raise from_triton_code(error.code(), error.message(), pb_utils.TritonError)
        return (pb_utils.get_output_tensor_by_name(response, "probability").as_numpy(),
                pb_utils.get_output_tensor_by_name(response, "decision").as_numpy())

    @staticmethod
    def _deliver(answer):
        if answer.error is not None:
            answer.token.send(_error(answer.error), flags=FINAL)
            return
        response = pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("probability", np.array([[answer.probability]], dtype=np.float32)),
            pb_utils.Tensor("decision", np.array([[answer.decision]], dtype=object)),
            pb_utils.Tensor("sequence_id", np.array([[answer.sequence_id]], dtype=np.int64)),
            pb_utils.Tensor("status", np.array([[answer.status_text.encode()]], dtype=object)),
        ])
        answer.token.send(response, flags=FINAL if answer.final else 0)

    def _expire_loop(self):
        while not self._stopping.is_set():
            # Cleared before the deadline is read: a record buffered after this point sets it again.
            self._wake.clear()
            try:
                fault_points.check("risk_stream.timer")
                deadline = self._session.expire()
                self._report()
            except Exception:  # noqa: BLE001 - the timer must outlive one bad round
                pb_utils.Logger.log_error(traceback.format_exc())
                deadline = None
            wait = IDLE_CHECK_SECONDS if deadline is None else (deadline - time.monotonic() * 1000.0) / 1000.0
            self._wake.wait(min(max(wait, 0.0), IDLE_CHECK_SECONDS))

    def _report(self):
        counts, buffered, streams = self._session.snapshot()
        counts["undelivered"] = self._session.delivery_failures
        with self._report_lock:
            for name, reported in self._reported.items():
                if counts[name] != reported:
                    self._metrics[name].increment(counts[name] - reported)
                    self._reported[name] = counts[name]
            self._metrics["buffered"].set(buffered)
            self._metrics["streams"].set(streams)


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
