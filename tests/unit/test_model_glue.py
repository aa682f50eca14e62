"""Each risk model's model.py driven without a server (tests/unit/python_backend.py): one response per request in
order, a bad record failing its own request only (INVALID_ARG, the field named), an internal failure answered
INTERNAL without the details, and BLS failures mapped to the caller's error kind."""
from __future__ import annotations

import json

import numpy as np
import pytest

from backends import fault_points
from tests.conftest import MODEL_REPOSITORY
from tests.unit import python_backend as backend
from tests.unit.python_backend import TritonError, payloads, request

RECORD = json.loads((MODEL_REPOSITORY.parent / "clients" / "examples" / "record.json").read_text())


@pytest.fixture
def pb_utils():
    return backend.backend_utils()


def model(pb_utils, name: str):
    folder = MODEL_REPOSITORY / name
    return backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder)


def without(record: dict, feature: str) -> dict:
    return {**record, "features": {k: v for k, v in record["features"].items() if k != feature}}


@pytest.fixture
def faulty(monkeypatch):
    def arm(point: str):
        monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse(point))
    return arm


def test_skill_adapter_packs_each_request_and_fails_a_bad_record_alone(pb_utils, built_artifacts):
    adapter = model(pb_utils, "skill_adapter")
    responses = adapter.execute([request(payload=payloads(RECORD, RECORD)),
                                 request(payload=payloads(without(RECORD, "purpose"))),
                                 request(payload=payloads(RECORD))])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[0].output("categorical").shape[0] == 2 and responses[2].output("numeric").shape[0] == 1
    assert np.array_equal(responses[0].output("categorical")[0], responses[2].output("categorical")[0])
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert responses[1].error().message().startswith("features.purpose: missing")


def test_risk_decision_decides_each_request_with_the_configured_thresholds(pb_utils, decision_thresholds):
    decision = model(pb_utils, "risk_decision")
    review, decline = decision_thresholds.review, decision_thresholds.decline
    responses = decision.execute([request(probability=np.array([[0.0], [decline]], dtype=np.float32)),
                                  request(probability=np.array([[review]], dtype=np.float32))])
    assert [r.output("decision").ravel().tolist() for r in responses] == [[b"APPROVE", b"DECLINE"], [b"REVIEW"]]


@pytest.mark.parametrize("name, point", [("risk_decision", "risk_decision.execute"),
                                         ("risk_pipeline", "risk_pipeline.execute"),
                                         ("skill_adapter", "skill_adapter.execute")])
def test_an_internal_failure_answers_every_request_internal_without_its_details(pb_utils, built_artifacts, faulty,
                                                                               name, point):
    faulty(point)
    glue = model(pb_utils, name)
    inputs = ({"probability": np.array([[0.5]], dtype=np.float32)} if name == "risk_decision"
              else {"payload": payloads(RECORD)})
    responses = glue.execute([request(**inputs), request(**inputs)])
    errors = [r.error() for r in responses]
    assert all(e is not None and e.code() == TritonError.INTERNAL for e in errors)
    assert errors[0] is not errors[1]  # a TritonError shared between responses crashes Triton 2.51
    assert all(e.message() == f"{name}: internal error" for e in errors)
    assert any("Traceback" in text for level, text in backend.Logger.lines if level == "error")


def test_risk_pipeline_scores_each_request_and_fails_a_bad_record_alone(pb_utils, built_artifacts):
    pipeline = model(pb_utils, "risk_pipeline")
    bad = {**RECORD, "features": {**RECORD["features"], "duration_in_month": "twelve"}}
    responses = pipeline.execute([request(payload=payloads(RECORD)), request(payload=payloads(RECORD, bad)),
                                  request(payload=payloads(RECORD, RECORD))])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert "features.duration_in_month: expected a number" in responses[1].error().message()
    first, third = responses[0], responses[2]
    assert third.output("probability").shape == (2, 1)
    assert third.output("probability")[1, 0] == pytest.approx(first.output("probability")[0, 0])
    assert third.output("decision")[0, 0] in (b"APPROVE", b"REVIEW", b"DECLINE")


def scorer(probability: float):
    def answer(bls):
        rows = len(next(t for t in bls.inputs() if t.name() == "numeric").as_numpy())
        return backend.InferenceResponse([backend.Tensor("probability", np.full((rows, 1), probability, np.float32))])
    return answer


def decider(bls):
    p = bls.inputs()[0].as_numpy()
    return backend.InferenceResponse([backend.Tensor("decision", np.where(p >= 0.5, b"DECLINE", b"APPROVE")
                                                     .astype(object))])


def test_risk_router_answers_from_the_primary_and_says_which_version_served(pb_utils, built_artifacts):
    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.75), "risk_decision": decider})
    router = model(pb_utils, "risk_router")
    responses = router.execute([request(payload=payloads(RECORD, RECORD)),
                                request(payload=payloads(without(RECORD, "purpose")))])
    assert responses[0].output("probability").ravel().tolist() == [0.75, 0.75]
    assert responses[0].output("decision").ravel().tolist() == [b"DECLINE", b"DECLINE"]
    assert responses[0].output("served_by").ravel().tolist() == [b"risk_scorer:1", b"risk_scorer:1"]
    assert responses[1].error().code() == TritonError.INVALID_ARG


@pytest.mark.parametrize("code, kind_code", [(TritonError.UNAVAILABLE, TritonError.UNAVAILABLE),
                                             (TritonError.INTERNAL, TritonError.INTERNAL)])
def test_risk_router_passes_a_failed_decision_call_on_as_the_callers_error(pb_utils, built_artifacts, code, kind_code):
    def failing(bls):
        return backend.InferenceResponse(error=TritonError("decision model gone", code))

    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.25), "risk_decision": failing})
    router = model(pb_utils, "risk_router")
    responses = router.execute([request(payload=payloads(RECORD)), request(payload=payloads(RECORD))])
    assert [r.error().code() for r in responses] == [kind_code, kind_code]
    assert "risk_decision: decision model gone" in responses[0].error().message()


def test_risk_router_refuses_a_route_to_a_model_it_does_not_serve(pb_utils, built_artifacts):
    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.25), "risk_decision": decider})
    router = model(pb_utils, "risk_router")
    responses = router.execute([request({"route": "../secrets"}, payload=payloads(RECORD)),
                                request(payload=payloads(RECORD))])
    assert responses[0].error().code() == TritonError.INVALID_ARG and "route" in responses[0].error().message()
    assert not responses[1].has_error()
