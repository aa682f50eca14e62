"""risk_stream: records of many streams in, each stream's answers out strictly in sequence_id order, once each.

Decoupled with the sequence batcher (correlation id = stream). A batch holds records of many streams: they are
scored on arrival by one BLS call to the scoring model (risk_pipeline), then each waits in its stream's reorder
buffer (backends/reorder_buffer.py) until its turn; its answer goes out through its own request's response
sender. A timer thread gives up missing ids after reorder_timeout_ms and evicts idle streams.
"""
import json
import threading
import time
import traceback
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.batch_scoring import Scored, retrying, score_isolating_bad_records
from backends.errors import InternalError, Unavailable, from_triton_code, triton_error
from backends.model_parameters import string_parameter
from backends.record_decoder import DEFAULT_MAX_RECORD_BYTES, RecordError, parse_record, stream_position
from backends.reorder_buffer import GAP, IN_ORDER, BufferFull, ReorderSettings, StreamTable

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Checked at least this often for idle streams, even when no record waits.
IDLE_CHECK_SECONDS = 1.0
COUNTERS = {
    "reordered": "records that arrived ahead of a missing id and waited in a reorder buffer",
    "duplicate": "records dropped because their sequence_id was already answered or waiting",
    "late": "records answered LATE: their sequence_id had already been given up as GAP",
    "gap": "sequence ids given up (answered GAP)",
    "overflow": "records refused because their stream's reorder buffer was full",
    "evicted": "idle streams evicted",
}


@dataclass
class Pending:
    sender: object
    scored: Scored


@dataclass
class Arrival:
    """One request; `error` set when its record has no usable place in the stream (answered at once)."""

    stream: str
    start: bool
    end: bool
    sender: object
    payload: bytes | None = None
    sequence_id: int | None = None
    error: RecordError | None = None


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _flag(request, name: str) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().ravel()[0])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("risk_stream answers records when their turn comes: its config must set "
                             "model_transaction_policy { decoupled: true }")
        parameters = config.get("parameters", {})
        self._settings = ReorderSettings.from_parameters(parameters)
        self._scoring_model = string_parameter(parameters, "scoring_model", "risk_pipeline")
        self._max_record_bytes = int(string_parameter(parameters, "max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        self._table = StreamTable(self._settings)
        self._score_batch = retrying(self._score)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self._families = {name: pb_utils.MetricFamily(f"s2t_stream_{name}_total", text, pb_utils.MetricFamily.COUNTER)
                          for name, text in COUNTERS.items()}
        self._families["buffered"] = pb_utils.MetricFamily(
            "s2t_stream_buffered", "records waiting in reorder buffers", pb_utils.MetricFamily.GAUGE)
        self._families["streams"] = pb_utils.MetricFamily(
            "s2t_stream_streams", "streams with reorder state", pb_utils.MetricFamily.GAUGE)
        self._metrics = {name: family.Metric(labels=labels) for name, family in self._families.items()}
        self._reported = {name: 0 for name in COUNTERS}
        self._timer = threading.Thread(target=self._expire_loop, name="risk_stream-expire", daemon=True)
        self._timer.start()

    def execute(self, requests):
        senders = [r.get_response_sender() for r in requests]
        handled = 0
        # The timer sleeps until the earliest reorder deadline; only a record that now waits can bring that
        # deadline forward, so only then is it woken (otherwise it rescans every stream for nothing).
        waiting = False
        try:
            fault_points.check("risk_stream.execute")
            arrivals = [self._arrival(r, s) for r, s in zip(requests, senders)]
            payloads = [a.payload for a in arrivals if a.error is None]
            scored = iter(score_isolating_bad_records(payloads, self._score_batch))
            now = _now_ms()
            with self._lock:
                for a in arrivals:
                    if a.start:
                        self._send(self._table.start(a.stream, now))
                    if a.error is not None:
                        a.sender.send(_error(a.error), flags=FINAL)
                    else:
                        waiting |= self._offer(a.stream, a.sequence_id, Pending(a.sender, next(scored)), now)
                    if a.end:
                        self._send(self._table.end(a.stream))
                    handled += 1
                self._report()
        except Exception:  # noqa: BLE001 - log it; every request not yet taken in still gets its final answer
            pb_utils.Logger.log_error(traceback.format_exc())
            for sender in senders[handled:]:
                sender.send(_error(InternalError("risk_stream: internal error")), flags=FINAL)
            waiting = True
        if waiting:
            self._wake.set()
        return None

    def finalize(self):
        self._stopping.set()
        self._wake.set()
        self._timer.join(timeout=5)
        with self._lock:
            self._send(self._table.end_all())

    def _arrival(self, request, sender) -> Arrival:
        arrival = Arrival(str(request.correlation_id()), _flag(request, "START"), _flag(request, "END"), sender)
        payloads = pb_utils.get_input_tensor_by_name(request, "payload").as_numpy().ravel()
        if len(payloads) != 1:
            arrival.error = RecordError("payload", f"a stream request carries one record, got {len(payloads)}")
            return arrival
        try:
            arrival.sequence_id = stream_position(parse_record(payloads[0], self._max_record_bytes), arrival.stream)
        except RecordError as err:
            arrival.error = err
            return arrival
        arrival.payload = payloads[0]
        return arrival

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

    def _offer(self, stream, sequence_id, pending, now) -> bool:
        """True when the record waits in the reorder buffer for a missing id."""
        try:
            offer = self._table.offer(stream, sequence_id, pending, now)
        except BufferFull as err:
            pending.sender.send(_error(Unavailable(
                f"stream {stream} sequence_id {sequence_id}: reorder buffer full, {err}")), flags=FINAL)
            return False
        if offer.duplicate:
            # Dropped: the request is closed with no answer (gRPC streams skip empty final responses).
            pending.sender.send(flags=FINAL)
        self._send(offer.emissions)
        return offer.reordered

    def _send(self, emissions):
        for e in emissions:
            if e.status == GAP:
                # Not final: the carrier's own answer follows, on the same sender.
                e.item.sender.send(self._answer(float("nan"), b"", e.sequence_id, f"GAP {e.sequence_id}-{e.last_id}"))
                continue
            scored = e.item.scored
            if scored.error is not None:
                e.item.sender.send(_error(type(scored.error)(f"sequence_id {e.sequence_id}: {scored.error.message}")),
                                   flags=FINAL)
            else:
                status = "OK" if e.status == IN_ORDER else e.status
                e.item.sender.send(self._answer(scored.probability, scored.decision, e.sequence_id, status),
                                   flags=FINAL)

    @staticmethod
    def _answer(probability, decision, sequence_id, status):
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("probability", np.array([[probability]], dtype=np.float32)),
            pb_utils.Tensor("decision", np.array([[decision]], dtype=object)),
            pb_utils.Tensor("sequence_id", np.array([[sequence_id]], dtype=np.int64)),
            pb_utils.Tensor("status", np.array([[status.encode()]], dtype=object)),
        ])

    def _expire_loop(self):
        while not self._stopping.is_set():
            # Cleared before the deadline is read: a record buffered after this point sets it again.
            self._wake.clear()
            try:
                with self._lock:
                    self._send(self._table.expire(_now_ms()))
                    deadline = self._table.next_deadline_ms()
                    self._report()
            except Exception:  # noqa: BLE001 - the timer must outlive one bad round
                pb_utils.Logger.log_error(traceback.format_exc())
                deadline = None
            wait = IDLE_CHECK_SECONDS if deadline is None else (deadline - _now_ms()) / 1000.0
            self._wake.wait(min(max(wait, 0.0), IDLE_CHECK_SECONDS))

    def _report(self):
        counts = vars(self._table.counts)
        for name in COUNTERS:
            if counts[name] != self._reported[name]:
                self._metrics[name].increment(counts[name] - self._reported[name])
                self._reported[name] = counts[name]
        self._metrics["buffered"].set(self._table.buffered)
        self._metrics["streams"].set(len(self._table))


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
