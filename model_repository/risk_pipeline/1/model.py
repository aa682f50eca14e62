"""risk_pipeline: legacy records -> probability and decision in one stub (decode, ONNX Runtime, thresholds)."""
import json
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.errors import InternalError, InvalidInput, triton_error
from backends.fused_pipeline import PipelineSettings, warm_pipeline
from backends.record_decoder import request_error
from backends.request_rows import RequestRows
from wire.names import PAYLOAD


class TritonPythonModel:
    def initialize(self, args):
        settings = PipelineSettings.from_parameters(json.loads(args["model_config"]).get("parameters", {}))
        # args["model_repository"] is this model's folder; the scorer is a sibling in the same repository.
        self._pipeline = warm_pipeline(Path(args["model_repository"]).parent, settings, args["model_name"])
        pb_utils.Logger.log_info(f"risk_pipeline keeps {settings.scorer_model} versions "
                                 f"{sorted(self._pipeline.pipelines)} warm, serves {self._pipeline.serving()}")

    def execute(self, requests):
        try:
            fault_points.check("risk_pipeline.execute")
            payloads = [pb_utils.get_input_tensor_by_name(r, PAYLOAD).as_numpy().ravel() for r in requests]
            rows = RequestRows.of(payloads)
            scored = self._pipeline.score(rows.join(payloads))
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            return [_error(InternalError("risk_pipeline: internal error")) for _ in requests]
        # Per request only what must be per request: two tensor views and the response (this loop is most of the
        # stub's Python time at one record per request).
        response, tensor = pb_utils.InferenceResponse, pb_utils.Tensor
        probability, decision, errors = scored.probability, scored.decision, scored.errors
        any_error = any(errors)
        responses = []
        for part in rows.slices:
            message = any_error and request_error(errors[part])
            if message:
                responses.append(_error(InvalidInput(message)))
            else:
                responses.append(response(output_tensors=[tensor("probability", probability[part]),
                                                          tensor("decision", decision[part])]))
        return responses


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
