"""skill_adapter: legacy JSON records -> the scorer's packed inputs; a bad record fails its request alone."""
import json
import traceback
from pathlib import Path

import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.errors import InternalError, InvalidInput, triton_error
from backends.feature_spec import FeatureSpec
from backends.model_parameters import read_parameters
from backends.record_decoder import AdapterSettings, RecordDecoder, request_error
from backends.request_rows import RequestRows
from wire.names import CATEGORICAL, NUMERIC, PAYLOAD


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        settings = read_parameters(AdapterSettings, config.get("parameters", {}))
        spec_path = Path(args["model_repository"]) / args["model_version"] / settings.feature_spec
        spec = FeatureSpec.from_file(spec_path)
        self._decoder = RecordDecoder(spec, settings.max_record_bytes)
        outputs = {o["name"]: o["dims"] for o in config["output"]}
        expected = {"categorical": [len(spec.categorical)], "numeric": [len(spec.numeric)]}
        for name, dims in expected.items():
            if [int(d) for d in outputs.get(name, [])] != dims:
                raise ValueError(f"output {name} must have dims {dims} to match {spec_path}, "
                                 f"config says {outputs.get(name)}")

    def execute(self, requests):
        try:
            fault_points.check("skill_adapter.execute")
            payloads = [pb_utils.get_input_tensor_by_name(r, PAYLOAD).as_numpy().ravel() for r in requests]
            rows = RequestRows.of(payloads)
            decoded = self._decoder.decode(rows.join(payloads))
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            return [_error(InternalError("skill_adapter: internal error")) for _ in requests]
        responses = []
        for part in rows.slices:
            message = request_error(decoded.errors[part])
            if message:
                responses.append(_error(InvalidInput(message)))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor(CATEGORICAL, decoded.categorical[part]),
                    pb_utils.Tensor(NUMERIC, decoded.numeric[part]),
                ]))
        return responses


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
