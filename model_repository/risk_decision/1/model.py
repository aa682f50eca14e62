"""risk_decision: probability -> APPROVE / REVIEW / DECLINE with the thresholds from config parameters."""
import triton_python_backend_utils as pb_utils

from s2t.backends.scoring.decision_policy import Thresholds, decide
from s2t.backends.runtime.triton_glue import Glue, ModelArgs, Rows
from s2t.wire.names import DECISION, PROBABILITY

SETTINGS = Thresholds
glue = Glue(pb_utils, "risk_decision")


class TritonPythonModel:
    def initialize(self, args):
        self._thresholds = glue.settings(SETTINGS, ModelArgs.of(args))

    def finalize(self):
        glue.finalize(self)

    @glue.batch(PROBABILITY)
    def execute(self, probability):
        return Rows({DECISION: decide(probability, self._thresholds)})
