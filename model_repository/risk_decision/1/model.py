"""risk_decision: probability -> APPROVE / REVIEW / DECLINE with the thresholds from config parameters."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from backends.decision_policy import Thresholds, decide


class TritonPythonModel:
    def initialize(self, args):
        self._thresholds = Thresholds.from_parameters(json.loads(args["model_config"]).get("parameters", {}))

    def execute(self, requests):
        probabilities = [pb_utils.get_input_tensor_by_name(r, "probability").as_numpy() for r in requests]
        decisions = decide(np.concatenate(probabilities), self._thresholds)
        bounds = np.cumsum([len(p) for p in probabilities])[:-1]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("decision", d)])
                for d in np.split(decisions, bounds)]
