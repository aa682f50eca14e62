"""risk_router: canary / shadow / breaker routing of legacy records over the scorers (BLS)."""
import numpy as np
import triton_python_backend_utils as pb_utils

from s2t.backends.routing.circuit_breaker import CircuitBreaker
from s2t.backends.routing.drift_watch import DriftMonitor, DriftWatch, Reference, choose_reference
from s2t.backends.records.feature_spec import FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder
from s2t.backends.routing.record_router import RecordRouter
from s2t.backends.runtime.repository_layout import version_numbers
from s2t.backends.routing.router_core import Router, RouterModelSettings
from s2t.backends.routing.router_metrics import DriftMetrics, RouterMetrics
from s2t.backends.routing.routing_policy import route_parameter
from s2t.backends.runtime.triton_glue import Glue, ModelArgs
from s2t.wire.names import CATEGORICAL, DECISION, NUMERIC, PAYLOAD, PROBABILITY, SERVED_BY

SETTINGS = RouterModelSettings
BLS_MAX_ROWS = 256
glue = Glue(pb_utils, "risk_router")


class TritonPythonModel:
    def initialize(self, args):
        model = ModelArgs.of(args)
        settings = glue.settings(SETTINGS, model)
        self._repository = model.repository
        spec = FeatureSpec.from_file(settings.feature_spec)
        self._router = Router(settings.routing, CircuitBreaker(settings.breaker), self._score, self._versions)
        self._records = RecordRouter(
            RecordDecoder(spec, settings.max_record_bytes), self._router,
            lambda p: glue.infer(settings.decision_model, {PROBABILITY: p}, [DECISION])[0],
            settings.decision_model, self._drift_watch(model.version_dir, settings, spec))
        self._metrics = RouterMetrics(glue.metric_family)

    def _drift_watch(self, version_dir, settings, spec):
        """Drift is watched only where a reference exists: the primary version's own (publish writes it from the
        gate's data), else the training reference `make` writes beside this file. Only the primary's scores are
        compared with it: a canary's or the fallback's would read as drift of the served model."""
        primary = settings.routing.primary
        training = version_dir / settings.drift_reference
        reference = choose_reference(self._repository, primary.model, primary.version, training,
                                     settings.drift_reference)
        if reference is None:
            pb_utils.Logger.log_warn(f"risk_router: no drift reference at {training}; feature drift is not watched")
            return None
        monitor = DriftMonitor(Reference.from_json(reference.read_text()), spec, settings.drift_window_records,
                               settings.drift_sample_rate, settings.drift_alert_psi)
        metrics = DriftMetrics(glue.metric_family, monitor.plans, settings.drift_window_records,
                               0 if reference == training else primary.version)
        self._drift = DriftWatch(monitor, metrics.publish, settings.drift_publish_seconds,
                                 lambda text: pb_utils.Logger.log_error(f"risk_router: {text}"),
                                 score_source=str(primary) if primary.version is not None else None)
        self._drift.start()
        return self._drift

    def finalize(self):
        if getattr(self, "_drift", None) is not None:
            self._drift.stop()
        glue.finalize(self)

    def _versions(self, model):
        # `model` is one of the configured targets (routing_policy refuses any other route): never client text.
        return version_numbers(self._repository / model)[::-1]

    def _score(self, target, categorical, numeric):
        return np.concatenate([glue.infer(target.model, {CATEGORICAL: categorical[i:i + BLS_MAX_ROWS],
                                                         NUMERIC: numeric[i:i + BLS_MAX_ROWS]},
                                          ["probability"], target.version)[0]
                               for i in range(0, len(numeric), BLS_MAX_ROWS)])

    @glue.execute
    def execute(self, requests):
        answers, batch = self._records.answer([glue.input(r, PAYLOAD).ravel() for r in requests],
                                              [route_parameter(r.parameters()) for r in requests])
        self._metrics.observe(batch, self._router.breaker.state)
        return [glue.error(a.error) if a.error is not None else glue.answer(
            {PROBABILITY: a.probability, DECISION: a.decision, SERVED_BY: a.served_by}) for a in answers]
