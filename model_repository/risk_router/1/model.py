"""risk_router: canary / shadow / breaker routing of legacy records over the scorers (BLS)."""
import json
import time
import traceback
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from backends import fault_points
from backends.circuit_breaker import CircuitBreaker
from backends.errors import InternalError, InvalidInput, ServingError, from_triton_code, of_kind, triton_error
from backends.drift import SCORE_FEATURE, DriftMonitor, Reference
from backends.feature_spec import FeatureSpec
from backends.model_parameters import read_parameters
from backends.record_decoder import RecordDecoder, request_error
from backends.router_core import Router, RouterModelSettings
from backends.router_metrics import DriftMetrics, RouterMetrics

BLS_MAX_ROWS = 256


class TritonPythonModel:
    def initialize(self, args):
        settings = read_parameters(RouterModelSettings, json.loads(args["model_config"]).get("parameters", {}))
        here = Path(args["model_repository"])
        self._repository = here.parent
        spec = FeatureSpec.from_file(here / args["model_version"] / settings.feature_spec)
        self._decoder = RecordDecoder(spec, settings.max_record_bytes)
        self._decision_model = settings.decision_model
        self._router = Router(settings.routing, CircuitBreaker(settings.breaker), self._score, self._versions)
        self._metrics = RouterMetrics(pb_utils.MetricFamily)
        self._drift = self._drift_monitor(here / args["model_version"], settings, spec)
        self._drift_published_at = -float("inf")  # the first sampled batch sets the gauges
        self._drift_publish_seconds = settings.drift_publish_seconds

    def _drift_monitor(self, version_dir, settings, spec):
        """Drift is watched only where the training reference was built (`make` writes it beside this file)."""
        reference = version_dir / settings.drift_reference
        if not reference.is_file():
            pb_utils.Logger.log_warn(f"risk_router: no drift reference at {reference}; feature drift is not watched")
            return None
        monitor = DriftMonitor(Reference.from_json(reference.read_text()), tuple(f.name for f in spec.categorical),
                               spec.numeric, settings.drift_sample_rate)
        self._drift_metrics = DriftMetrics(pb_utils.MetricFamily, (*spec.names, SCORE_FEATURE))
        return monitor

    def _versions(self, model):
        # `model` is one of the configured targets (routing_policy refuses any other route): never client text.
        folder = self._repository / model
        return sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True) if folder.is_dir() else []

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
            pb_utils.Tensor("categorical", categorical[i:i + BLS_MAX_ROWS]),
            pb_utils.Tensor("numeric", numeric[i:i + BLS_MAX_ROWS])], "probability")
            for i in range(0, len(numeric), BLS_MAX_ROWS)])

    def execute(self, requests):
        try:
            fault_points.check("risk_router.execute")
            return self._execute(requests)
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            pb_utils.Logger.log_error(traceback.format_exc())
            return [_error(InternalError("risk_router: internal error")) for _ in requests]

    def _execute(self, requests):
        payloads = [pb_utils.get_input_tensor_by_name(r, "payload").as_numpy().ravel() for r in requests]
        overrides = [_route(r) for r in requests]
        flat = [p for batch in payloads for p in batch]
        decoded = self._decoder.decode(flat)
        valid = [i for i, e in enumerate(decoded.errors) if e is None]
        owner = np.repeat(np.arange(len(requests)), [len(b) for b in payloads])
        keys = [decoded.request_ids[i] or flat[i] for i in valid]
        answer = self._router.answer(decoded.categorical[valid], decoded.numeric[valid], keys,
                                     [overrides[owner[i]] for i in valid])
        scored = [k for k, e in enumerate(answer.errors) if e is None]
        decisions = np.empty((len(valid), 1), dtype=object)
        if scored:
            try:
                decisions[scored] = self._infer(self._decision_model, -1, [
                    pb_utils.Tensor("probability", answer.probability[scored])], "decision")
            except ServingError as err:
                for k in scored:
                    answer.errors[k] = of_kind(err.kind, f"{self._decision_model}: {err.message}")
        self._metrics.observe(answer, self._router.breaker.state)
        if self._drift is not None and scored:
            try:
                self._watch_drift(decoded.categorical[valid][scored], decoded.numeric[valid][scored],
                                  answer.probability[scored])
            except Exception:  # noqa: BLE001 - monitoring never fails an answer; stop watching, say why
                pb_utils.Logger.log_error("risk_router: drift monitoring stopped:\n" + traceback.format_exc())
                self._drift = None

        row_of = {i: k for k, i in enumerate(valid)}
        responses, start = [], 0
        for batch in payloads:
            rows = list(range(start, start + len(batch)))
            start += len(batch)
            bad_record = request_error(decoded.errors[rows[0]:rows[-1] + 1])
            if bad_record:
                responses.append(_error(InvalidInput(bad_record)))
                continue
            picked = [row_of[i] for i in rows]
            failed = [answer.errors[k] for k in picked if answer.errors[k] is not None]
            if failed:
                # The caller's own mistake (a bad route) is what it must fix first; otherwise the first failure.
                first = next((e for e in failed if isinstance(e, InvalidInput)), failed[0])
                responses.append(_error(of_kind(first.kind, "; ".join(sorted({e.message for e in failed})))))
                continue
            served_by = np.array([[answer.served_by[k].encode()] for k in picked], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("probability", answer.probability[picked]),
                pb_utils.Tensor("decision", decisions[picked]),
                pb_utils.Tensor("served_by", served_by),
            ]))
        return responses


    def _watch_drift(self, categorical, numeric, probability):
        self._drift.observe(categorical, numeric, probability)
        now = time.monotonic()
        if now - self._drift_published_at >= self._drift_publish_seconds:
            self._drift_published_at = now
            self._drift_metrics.publish(self._drift.psi())


def _route(request):
    """The `route` request parameter as the client sent it (any JSON type); routing_policy checks it."""
    try:
        return json.loads(request.parameters() or "{}").get("route")
    except (ValueError, AttributeError):
        return None


def _error(err):
    # A new TritonError for every response: Triton 2.51 crashes when responses share one.
    return pb_utils.InferenceResponse(error=triton_error(err, pb_utils.TritonError))
