"""risk_stream: records of many streams in, each stream's answers out strictly in sequence_id order, once each.
Decoupled, sequence batcher (correlation id = stream). Triton requests -> arrivals, answers -> responses; the rest is
backends/streaming/session.py (reordering, scoring by BLS) and backends/streaming/upkeep.py (timer, metrics)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from s2t.backends.scoring.batch_scoring import retrying
from s2t.backends.streaming.session import Arrival, StreamModelSettings, StreamSession, check_sequence_batching
from s2t.backends.streaming.upkeep import ExpiryTimer, StreamMetrics
from s2t.backends.runtime.triton_glue import Glue, ModelArgs
from s2t.wire.names import DECISION, PAYLOAD, PROBABILITY

SETTINGS = StreamModelSettings
glue = Glue(pb_utils, "risk_stream")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        glue.require_decoupled(model, "answers records when their turn comes")
        settings = glue.settings(SETTINGS, model)
        check_sequence_batching(settings, model.config.get("sequence_batching", {}))
        self._scoring_model = settings.scoring_model
        self._session = StreamSession(settings.reorder, retrying(self._score), self._deliver,
                                      settings.max_record_bytes, log=pb_utils.Logger.log_error)
        self._metrics = StreamMetrics(glue.metric_family, {"model": model.name, "version": model.version},
                                      pb_utils.Logger.log_error)
        self._timer = ExpiryTimer(self._session, lambda: self._metrics.report(self._session),
                                  pb_utils.Logger.log_error)

    def execute(self, requests):
        taken, waiting = glue.take_in(requests, lambda senders: self._session.arrive(
            [Arrival.of_request(s, str(r.correlation_id()), glue.flag(r, "START"), glue.flag(r, "END"),
                                glue.input(r, PAYLOAD).ravel()) for r, s in zip(requests, senders)]))
        # Only a record that now waits can bring the timer's deadline forward; any other wake-up rescans for nothing.
        if waiting:
            self._timer.wake()
        if taken:
            self._metrics.report(self._session)

    def finalize(self):
        self._timer.stop()
        self._session.close()
        glue.finalize(self)

    def _score(self, payloads):
        return glue.infer(self._scoring_model, {PAYLOAD: np.array(payloads, dtype=object).reshape(-1, 1)},
                          [PROBABILITY, DECISION], failure="internal error while scoring")

    @staticmethod
    def _deliver(answer):
        if answer.error is not None:
            glue.send(answer.token, glue.error(answer.error), final=True)
            return
        glue.send(answer.token, glue.answer({
            PROBABILITY: np.array([[answer.probability]], dtype=np.float32),
            DECISION: np.array([[answer.decision]], dtype=object),
            "sequence_id": np.array([[answer.sequence_id]], dtype=np.int64),
            "status": np.array([[answer.status_text.encode()]], dtype=object)}), final=answer.final)
