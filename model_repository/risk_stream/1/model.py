"""risk_stream: records of many streams in, each stream's answers out strictly in sequence_id order, once each.
Decoupled, sequence batcher (correlation id = stream). Triton requests -> arrivals, answers -> responses; the rest is
backends/stream_session.py (reordering, scoring by BLS) and backends/stream_upkeep.py (timer, metrics)."""
import json
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.batch_scoring import retrying
from backends.errors import InternalError, from_triton_code, triton_error
from backends.model_parameters import read_parameters
from backends.stream_session import Arrival, StreamModelSettings, StreamSession, check_sequence_batching
from backends.stream_upkeep import ExpiryTimer, StreamMetrics
from wire.names import DECISION, PAYLOAD, PROBABILITY

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


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
        check_sequence_batching(settings, config.get("sequence_batching", {}))
        self._scoring_model = settings.scoring_model
        self._session = StreamSession(settings.reorder, retrying(self._score), self._deliver,
                                      settings.max_record_bytes, log=pb_utils.Logger.log_error)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self._metrics = StreamMetrics(pb_utils.MetricFamily, labels)
        self._timer = ExpiryTimer(self._session, lambda: self._metrics.report(self._session),
                                  pb_utils.Logger.log_error)

    def execute(self, requests):
        senders = [r.get_response_sender() for r in requests]
        try:
            fault_points.check("risk_stream.execute")
            waiting = self._session.arrive([self._arrival(r, s) for r, s in zip(requests, senders)])
        except Exception:  # noqa: BLE001 - before any record was taken in (decoding or scoring): answer them all
            pb_utils.Logger.log_error(traceback.format_exc())
            for sender in senders:
                sender.send(_error(InternalError("risk_stream: internal error")), flags=FINAL)
            return None
        # Only a record that now waits can bring the timer's deadline forward; any other wake-up rescans for nothing.
        if waiting:
            self._timer.wake()
        self._metrics.report(self._session)
        return None

    def finalize(self):
        self._timer.stop()
        self._session.close()

    @staticmethod
    def _arrival(request, sender) -> Arrival:
        return Arrival.of_request(sender, str(request.correlation_id()), _flag(request, "START"), _flag(request, "END"),
                                  pb_utils.get_input_tensor_by_name(request, PAYLOAD).as_numpy().ravel())

    def _score(self, payloads):
        request = pb_utils.InferenceRequest(
            model_name=self._scoring_model, requested_output_names=[PROBABILITY, DECISION],
            inputs=[pb_utils.Tensor(PAYLOAD, np.array(payloads, dtype=object).reshape(-1, 1))])
        try:
            response = request.exec()
        except Exception:  # noqa: BLE001 - the stub's own failure: log it, answer the records with an error
            pb_utils.Logger.log_error(traceback.format_exc())
            raise InternalError("risk_stream: internal error while scoring") from None
        if response.has_error():
            error = response.error()
            raise from_triton_code(error.code(), error.message(), pb_utils.TritonError)
        return (pb_utils.get_output_tensor_by_name(response, PROBABILITY).as_numpy(),
                pb_utils.get_output_tensor_by_name(response, DECISION).as_numpy())

    @staticmethod
    def _deliver(answer):
        if answer.error is not None:
            answer.token.send(_error(answer.error), flags=FINAL)
            return
        response = pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(PROBABILITY, np.array([[answer.probability]], dtype=np.float32)),
            pb_utils.Tensor(DECISION, np.array([[answer.decision]], dtype=object)),
            pb_utils.Tensor("sequence_id", np.array([[answer.sequence_id]], dtype=np.int64)),
            pb_utils.Tensor("status", np.array([[answer.status_text.encode()]], dtype=object)),
        ])
        answer.token.send(response, flags=FINAL if answer.final else 0)


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
