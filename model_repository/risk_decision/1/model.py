"""risk_decision: probability -> APPROVE / REVIEW / DECLINE with the thresholds from config parameters."""
import json
import traceback

import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.decision_policy import Thresholds, decide
from backends.errors import InternalError, triton_error
from backends.request_rows import RequestRows
from wire.names import DECISION, PROBABILITY


class TritonPythonModel:
    def initialize(self, args):
        self._thresholds = Thresholds.from_parameters(json.loads(args["model_config"]).get("parameters", {}))

    def execute(self, requests):
        try:
            fault_points.check("risk_decision.execute")
            probabilities = [pb_utils.get_input_tensor_by_name(r, PROBABILITY).as_numpy() for r in requests]
            rows = RequestRows.of(probabilities)
            decisions = decide(rows.join(probabilities), self._thresholds)
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            # A new TritonError for every response: Triton 2.51 crashes when responses share one.
            return [pb_utils.InferenceResponse(error=triton_error(InternalError("risk_decision: internal error"),
                                                                  pb_utils.TritonError)) for _ in requests]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(DECISION, d)])
                for d in rows.split(decisions)]
