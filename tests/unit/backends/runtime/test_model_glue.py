"""Each risk model's model.py driven without a server (tests/unit/python_backend.py): one response per request in
order, a bad record failing its own request only (INVALID_ARG, the field named), an internal failure answered
INTERNAL without the details, and BLS failures mapped to the caller's error kind."""
from __future__ import annotations

import json

import numpy as np
import pytest

from s2t.backends.runtime import fault_points
from tests.conftest import ROOT
from tests.unit import python_backend as backend
from tests.unit.python_backend import TritonError, payloads, request

RECORD = json.loads((ROOT / "clients" / "examples" / "record.json").read_text())


@pytest.fixture
def pb_utils():
    return backend.backend_utils()


@pytest.fixture
def model(pb_utils, model_repository):
    """Loads a model of the unit level's repository (tiny scorer and specs) as Triton would."""
    def load(name: str):
        folder = model_repository / name
        return backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder)
    return load


def without(record: dict, feature: str) -> dict:
    return {**record, "features": {k: v for k, v in record["features"].items() if k != feature}}


@pytest.fixture
def faulty(monkeypatch):
    def arm(point: str):
        monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse(point))
    return arm


def test_skill_adapter_packs_each_request_and_fails_a_bad_record_alone(pb_utils, model):
    adapter = model("skill_adapter")
    responses = adapter.execute([request(payload=payloads(RECORD, RECORD)),
                                 request(payload=payloads(without(RECORD, "purpose"))),
                                 request(payload=payloads(RECORD))])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[0].output("categorical").shape[0] == 2 and responses[2].output("numeric").shape[0] == 1
    assert np.array_equal(responses[0].output("categorical")[0], responses[2].output("categorical")[0])
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert responses[1].error().message().startswith("features.purpose: missing")


def test_risk_decision_decides_each_request_with_the_configured_thresholds(model, decision_thresholds):
    decision = model("risk_decision")
    review, decline = decision_thresholds.review, decision_thresholds.decline
    responses = decision.execute([request(probability=np.array([[0.0], [decline]], dtype=np.float32)),
                                  request(probability=np.array([[review]], dtype=np.float32))])
    assert [r.output("decision").ravel().tolist() for r in responses] == [[b"APPROVE", b"DECLINE"], [b"REVIEW"]]


@pytest.mark.parametrize("name, point", [("risk_decision", "risk_decision.execute"),
                                         ("skill_adapter", "skill_adapter.execute")])
def test_an_internal_failure_answers_every_request_internal_without_its_details(pb_utils, model, faulty,
                                                                               name, point):
    faulty(point)
    glue = model(name)
    inputs = ({"probability": np.array([[0.5]], dtype=np.float32)} if name == "risk_decision"
              else {"payload": payloads(RECORD)})
    responses = glue.execute([request(**inputs), request(**inputs)])
    errors = [r.error() for r in responses]
    assert all(e is not None and e.code() == TritonError.INTERNAL for e in errors)
    assert errors[0] is not errors[1]  # a TritonError shared between responses crashes Triton 2.51
    assert all(e.message() == f"{name}: internal error" for e in errors)
    assert any("Traceback" in text for level, text in backend.Logger.lines if level == "error")


def scorer(probability: float):
    def answer(bls):
        rows = len(next(t for t in bls.inputs() if t.name() == "numeric").as_numpy())
        return backend.InferenceResponse([backend.Tensor("probability", np.full((rows, 1), probability, np.float32))])
    return answer


def decider(bls):
    p = bls.inputs()[0].as_numpy()
    return backend.InferenceResponse([backend.Tensor("decision", np.where(p >= 0.5, b"DECLINE", b"APPROVE")
                                                     .astype(object))])


def test_risk_router_answers_from_the_primary_and_says_which_version_served(pb_utils, model):
    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.75), "risk_decision": decider})
    router = model("risk_router")
    responses = router.execute([request(payload=payloads(RECORD, RECORD)),
                                request(payload=payloads(without(RECORD, "purpose")))])
    assert responses[0].output("probability").ravel().tolist() == [0.75, 0.75]
    assert responses[0].output("decision").ravel().tolist() == [b"DECLINE", b"DECLINE"]
    assert responses[0].output("served_by").ravel().tolist() == [b"risk_scorer:1", b"risk_scorer:1"]
    assert responses[1].error().code() == TritonError.INVALID_ARG


@pytest.mark.parametrize("code, kind_code", [(TritonError.UNAVAILABLE, TritonError.UNAVAILABLE),
                                             (TritonError.INTERNAL, TritonError.INTERNAL)])
def test_risk_router_passes_a_failed_decision_call_on_as_the_callers_error(pb_utils, model, code, kind_code):
    def failing(bls):
        return backend.InferenceResponse(error=TritonError("decision model gone", code))

    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.25), "risk_decision": failing})
    router = model("risk_router")
    responses = router.execute([request(payload=payloads(RECORD)), request(payload=payloads(RECORD))])
    assert [r.error().code() for r in responses] == [kind_code, kind_code]
    assert "risk_decision: decision model gone" in responses[0].error().message()


def test_risk_router_refuses_a_route_to_a_model_it_does_not_serve(pb_utils, model):
    pb_utils.InferenceRequest.bls.update({"risk_scorer": scorer(0.25), "risk_decision": decider})
    router = model("risk_router")
    responses = router.execute([request({"route": "../secrets"}, payload=payloads(RECORD)),
                                request(payload=payloads(RECORD))])
    assert responses[0].error().code() == TritonError.INVALID_ARG and "route" in responses[0].error().message()
    assert not responses[1].has_error()


def pipeline_of(probability: float):
    def answer(bls):
        rows = len(bls.inputs()[0].as_numpy())
        return backend.InferenceResponse([backend.Tensor("probability", np.full((rows, 1), probability, np.float32)),
                                          backend.Tensor("decision", np.full((rows, 1), b"REVIEW", dtype=object))])
    return answer


def stream_record(stream_id: int, sequence_id: int) -> np.ndarray:
    return payloads({**RECORD, "stream_id": str(stream_id), "sequence_id": sequence_id})


def answered(req) -> list[tuple[bytes, int, float, bool]]:
    assert req.sender.done.wait(5), "no final response"
    out = []
    for response, flags in req.sender.sent:
        assert not response.has_error(), response.error().message()
        out.append((response.output("status")[0, 0], int(response.output("sequence_id")[0, 0]),
                    float(response.output("probability")[0, 0]), bool(flags & 1)))
    return out


@pytest.fixture
def stream(pb_utils, model):
    pb_utils.InferenceRequest.bls["risk_pipeline"] = pipeline_of(0.5)
    glue = model("risk_stream")
    yield glue
    glue.finalize()


def test_risk_stream_answers_each_record_in_sequence_order_once(pb_utils, stream):
    ahead = request(correlation_id=7, payload=stream_record(7, 1))
    first = request(correlation_id=7, payload=stream_record(7, 0), START=np.array([[True]]))
    assert stream.execute([ahead]) is None and stream.execute([first]) is None
    assert answered(first) == [(b"OK", 0, 0.5, True)]
    assert answered(ahead) == [(b"OK", 1, 0.5, True)]


def test_risk_stream_answers_late_and_duplicate_records_with_their_status_not_ok(pb_utils, stream):
    stream.execute([request(correlation_id=8, payload=stream_record(8, 0), START=np.array([[True]]))])
    again = request(correlation_id=8, payload=stream_record(8, 0))
    stream.execute([again])
    assert [status for status, *_ in answered(again)] == [b"DUPLICATE"]


def test_risk_stream_fails_a_request_of_two_records_alone(pb_utils, stream):
    two = request(correlation_id=9, payload=np.concatenate([stream_record(9, 0), stream_record(9, 1)]))
    good = request(correlation_id=10, payload=stream_record(10, 0), START=np.array([[True]]))
    stream.execute([two, good])
    assert two.sender.done.wait(5) and good.sender.done.wait(5)
    (error_response, flags), = two.sender.sent
    assert flags == 1 and error_response.error().code() == TritonError.INVALID_ARG
    assert "a stream request carries one record, got 2" in error_response.error().message()
    assert answered(good) == [(b"OK", 0, 0.5, True)]


def test_risk_stream_answers_every_request_internal_when_scoring_breaks(pb_utils, stream):
    def broken(bls):
        raise RuntimeError("stub lost")

    pb_utils.InferenceRequest.bls["risk_pipeline"] = broken
    requests = [request(correlation_id=stream_id, payload=stream_record(stream_id, 0), START=np.array([[True]]))
                for stream_id in (11, 12, 13)]
    stream.execute(requests)
    for req in requests:
        assert req.sender.done.wait(5)
        (response, flags), = req.sender.sent
        assert flags == 1 and response.error().code() in (TritonError.INTERNAL, TritonError.UNAVAILABLE)


def test_the_onnxruntime_backend_runs_each_request_and_fails_a_misshapen_one_alone(pb_utils, model, model_repository):
    adapter = model("skill_adapter")
    packed = adapter.execute([request(payload=payloads(RECORD, RECORD))])[0]
    categorical, numeric = packed.output("categorical"), packed.output("numeric")
    folder = model_repository / "risk_scorer"
    scorer = backend.initialize(backend.load_model(ROOT / "backends" / "runtime" / "onnxruntime" / "model.py",
                                                   pb_utils), folder)
    responses = scorer.execute([request(categorical=categorical, numeric=numeric),
                                request(categorical=categorical, numeric=numeric[:, :3]),
                                request(categorical=categorical[:1], numeric=numeric[:1])])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[0].output("probability").shape == (2, 1)
    assert responses[2].output("probability")[0, 0] == pytest.approx(responses[0].output("probability")[0, 0])
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert responses[1].error().message().startswith("onnxruntime: ")
