"""risk_router: canary / shadow / breaker routing of legacy records over the scorers (BLS)."""
import json
import traceback
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.circuit_breaker import CircuitBreaker
from backends.drift import DriftMonitor, DriftWatch, Reference, choose_reference
from backends.errors import InternalError, from_triton_code, triton_error
from backends.feature_spec import FeatureSpec
from backends.model_parameters import read_parameters
from backends.record_decoder import RecordDecoder
from backends.record_router import RecordRouter
from backends.router_core import Router, RouterModelSettings
from backends.repository_layout import version_numbers
from backends.router_metrics import DriftMetrics, RouterMetrics
from backends.routing_policy import route_parameter
from wire.names import CATEGORICAL, DECISION, NUMERIC, PAYLOAD, PROBABILITY, SERVED_BY

BLS_MAX_ROWS = 256


class TritonPythonModel:
    def initialize(self, args):
        settings = read_parameters(RouterModelSettings, json.loads(args["model_config"]).get("parameters", {}))
        here = Path(args["model_repository"])
        self._repository = here.parent
        spec = FeatureSpec.from_file(here / args["model_version"] / settings.feature_spec)
        self._router = Router(settings.routing, CircuitBreaker(settings.breaker), self._score, self._versions)
        self._records = RecordRouter(
            RecordDecoder(spec, settings.max_record_bytes), self._router,
            lambda p: self._infer(settings.decision_model, -1, [pb_utils.Tensor(PROBABILITY, p)], "decision"),
            settings.decision_model, self._drift_watch(here / args["model_version"], settings, spec))
        self._metrics = RouterMetrics(pb_utils.MetricFamily)

    def _drift_watch(self, version_dir, settings, spec):
        """Drift is watched only where a reference exists: the primary version's own (publish writes it from the
        gate's data), else the training reference `make` writes beside this file. Only the primary's scores are
        compared with it: a canary's or the fallback's would read as drift of the served model."""
        primary = settings.routing.primary
        training = version_dir / settings.drift_reference
        reference = choose_reference(self._repository, primary.model, primary.version, training,
                                     settings.drift_reference)
        if reference is None:
            pb_utils.Logger.log_warn(f"risk_router: no drift reference at {training}; "
                                     "feature drift is not watched")
            return None
        monitor = DriftMonitor(Reference.from_json(reference.read_text()), spec, settings.drift_window_records,
                               settings.drift_sample_rate, settings.drift_alert_psi)
        metrics = DriftMetrics(pb_utils.MetricFamily, monitor.plans, settings.drift_window_records,
                               0 if reference == training else primary.version)
        self._drift = DriftWatch(monitor, metrics.publish, settings.drift_publish_seconds,
                                 lambda text: pb_utils.Logger.log_error(f"risk_router: {text}"),
                                 score_source=str(primary) if primary.version is not None else None)
        self._drift.start()
        return self._drift

    def finalize(self):
        if getattr(self, "_drift", None) is not None:
            self._drift.stop()

    def _versions(self, model):
        # `model` is one of the configured targets (routing_policy refuses any other route): never client text.
        return version_numbers(self._repository / model)[::-1]

    def _infer(self, model, version, inputs, output):
        request = pb_utils.InferenceRequest(model_name=model, model_version=version, inputs=inputs,
                                            requested_output_names=[output])
        try:
            response = request.exec()
        except Exception:  # noqa: BLE001 - the stub's own failure: log it, answer the rows with an error
            pb_utils.Logger.log_error(traceback.format_exc())
            raise InternalError(f"risk_router: internal error calling {model}") from None
        if response.has_error():
            error = response.error()
            raise from_triton_code(error.code(), error.message(), pb_utils.TritonError)
        return pb_utils.get_output_tensor_by_name(response, output).as_numpy()

    def _score(self, target, categorical, numeric):
        return np.concatenate([self._infer(target.model, target.version, [
            pb_utils.Tensor(CATEGORICAL, categorical[i:i + BLS_MAX_ROWS]),
            pb_utils.Tensor(NUMERIC, numeric[i:i + BLS_MAX_ROWS])], "probability")
            for i in range(0, len(numeric), BLS_MAX_ROWS)])

    def execute(self, requests):
        try:
            fault_points.check("risk_router.execute")
            return self._execute(requests)
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            return [_error(InternalError("risk_router: internal error")) for _ in requests]

    def _execute(self, requests):
        answers, batch = self._records.answer(
            [pb_utils.get_input_tensor_by_name(r, PAYLOAD).as_numpy().ravel() for r in requests],
            [route_parameter(r.parameters()) for r in requests])
        self._metrics.observe(batch, self._router.breaker.state)
        return [_error(a.error) if a.error is not None else pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(PROBABILITY, a.probability), pb_utils.Tensor(DECISION, a.decision),
            pb_utils.Tensor(SERVED_BY, a.served_by)]) for a in answers]


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
