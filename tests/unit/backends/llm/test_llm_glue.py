"""`llm` and `risk_explainer`'s model.py driven without a server (tests/unit/python_backend.py): every request gets
exactly one final response, streamed parts before it, and a bad request its own INVALID_ARG. `llm` runs the real
GGUF model on llama.cpp; `risk_explainer`'s two BLS calls go to stand-ins."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from tests.conftest import LLM_REPOSITORY, MODEL_REPOSITORY
from tests.unit import python_backend as backend
from tests.unit.python_backend import TritonError, payloads, request

RECORD = json.loads((MODEL_REPOSITORY.parent / "clients" / "examples" / "record.json").read_text())
FINAL = backend.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@pytest.fixture
def pb_utils():
    return backend.backend_utils()


def finished(req, timeout=120) -> list:
    assert req.sender.done.wait(timeout), "no final response"
    assert [flags for _, flags in req.sender.sent][-1] == FINAL
    assert all(flags == 0 for _, flags in req.sender.sent[:-1])
    return [response for response, _ in req.sender.sent]


def text_of(responses) -> str:
    return "".join(r.output("text_output")[0].decode() for r in responses
                   if r is not None and not r.has_error() and any(t.name() == "text_output" for t in r.output_tensors()))


@pytest.fixture
def llm(pb_utils):
    glue = backend.initialize(backend.load_model(LLM_REPOSITORY / "llm" / "1" / "model.py", pb_utils),
                              LLM_REPOSITORY / "llm")
    yield glue
    glue.finalize()


def test_llm_streams_tokens_then_one_final_answer_and_refuses_a_bad_request_alone(llm):
    good = request(text_input=np.array([b"Say hello."], dtype=object), max_tokens=np.array([8], dtype=np.int32))
    over = request(text_input=np.array([b"Say hello."], dtype=object), max_tokens=np.array([100_000], dtype=np.int32))
    empty = request(text_input=np.array([b""], dtype=object))
    assert llm.execute([good, over, empty]) is None
    streamed = finished(good)
    final = streamed[-1]
    # Empty parts are the probes sent while a request waits for its first token.
    tokens = [r for r in streamed[:-1] if r.output("text_output")[0]]
    assert int(final.output("output_tokens")[0]) == len(tokens) >= 1
    assert final.output("finish_reason")[0] in (b"length", b"stop")
    for refused, field in ((over, "max_tokens"), (empty, "text_input")):
        (response,) = finished(refused)
        assert response.error().code() == TritonError.INVALID_ARG and response.error().message().startswith(field)


def pipeline(bls):
    return backend.InferenceResponse([backend.Tensor("probability", np.array([[0.42]], np.float32)),
                                      backend.Tensor("decision", np.array([[b"REVIEW"]], dtype=object))])


@pytest.fixture
def explainer(pb_utils, repositories):
    pb_utils.InferenceRequest.bls["risk_pipeline"] = pipeline
    folder = repositories["model_repository_llm"] / "risk_explainer"
    glue = backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder)
    yield glue
    glue.finalize()


def test_risk_explainer_sends_the_score_and_reasons_first_then_the_language_models_words(pb_utils, explainer):
    pb_utils.InferenceRequest.bls["llm_router"] = lambda bls: iter(
        [backend.InferenceResponse([backend.Tensor("text_output", np.array([t], dtype=object))])
         for t in (b"A moderate ", b"risk.")])
    req = request(payload=payloads(RECORD))
    explainer.execute([req])
    head, *words, final = finished(req)
    assert head.output("probability")[0] == pytest.approx(0.42) and head.output("decision")[0] == b"REVIEW"
    assert 1 <= len(head.output("reasons")) <= 3
    assert text_of(words) == "A moderate risk." and final.output("source")[0] == b"llm"


def test_risk_explainer_answers_with_the_template_when_the_language_model_fails(pb_utils, explainer):
    def broken(bls):
        raise RuntimeError("llm not loaded")

    pb_utils.InferenceRequest.bls["llm_router"] = broken
    req = request(payload=payloads(RECORD))
    explainer.execute([req])
    head, final = finished(req)
    assert final.output("source")[0] == b"template" and "REVIEW" in final.output("text_output")[0].decode().upper()


def test_risk_explainer_fails_a_bad_record_alone_naming_the_field(pb_utils, explainer):
    pb_utils.InferenceRequest.bls["llm_router"] = lambda bls: iter([])
    bad = request(payload=payloads({**RECORD, "features": {**RECORD["features"], "age_in_years": "old"}}))
    two = request(payload=payloads(RECORD, RECORD))
    explainer.execute([bad, two])
    for req, message in ((bad, "features.age_in_years: "), (two, "payload: one record per request, got 2")):
        (response,) = finished(req)
        assert response.error().code() == TritonError.INVALID_ARG and message in response.error().message()


@pytest.fixture
def hanging_llm(pb_utils):
    """`llm` (behind llm_router) as a killed stub leaves it: one word, then a stream that never yields again (until the test ends)."""
    release, calls = threading.Event(), []

    def stream(bls):
        calls.append(bls)
        yield backend.InferenceResponse([backend.Tensor("text_output", np.array([b"The "], dtype=object))])
        release.wait(60)

    pb_utils.InferenceRequest.bls["llm_router"] = stream
    yield calls
    release.set()


# How long the explainer waits for a word mid-answer here: any wait ends a stream that never yields again.
TOKEN_TIMEOUT_S = 0.1


def impatient_explainer(pb_utils, repositories, workers: int):
    from google.protobuf import json_format

    from s2t.triton_config import load
    folder = repositories["model_repository_llm"] / "risk_explainer"
    config = json_format.MessageToDict(load(folder), preserving_proto_field_name=True)
    config["parameters"]["token_timeout_s"] = {"string_value": str(TOKEN_TIMEOUT_S)}
    config["parameters"]["workers"] = {"string_value": str(workers)}
    pb_utils.InferenceRequest.bls["risk_pipeline"] = pipeline
    return backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder, config=config)


def test_risk_explainer_ends_a_stream_whose_language_model_stops_mid_answer_and_frees_its_worker(
        pb_utils, repositories, hanging_llm):
    glue = impatient_explainer(pb_utils, repositories, workers=1)
    try:
        first, second = request(payload=payloads(RECORD)), request(payload=payloads(RECORD))
        glue.execute([first, second])
        for req in (first, second):
            head, word, final = finished(req, timeout=30)
            assert head.output("decision")[0] == b"REVIEW" and word.output("text_output")[0] == b"The "
            assert final.error().code() == TritonError.UNAVAILABLE
            assert f"sent no word for {TOKEN_TIMEOUT_S:g} s mid-explanation" in final.error().message()
    finally:
        glue.finalize()


def test_risk_explainer_stops_asking_a_model_that_left_too_many_streams_unanswered(pb_utils, repositories,
                                                                                  hanging_llm):
    from s2t.backends.llm.explainer import ABANDONED_PER_WORKER
    glue = impatient_explainer(pb_utils, repositories, workers=1)
    try:
        bound = 1 + ABANDONED_PER_WORKER
        requests = [request(payload=payloads(RECORD)) for _ in range(bound + 2)]
        glue.execute(requests)
        sources = []
        for req in requests:
            final = finished(req, timeout=30)[-1]
            sources.append("error" if final.has_error() else final.output("source")[0].decode())
        assert sources == ["error"] * bound + ["template"] * 2 and len(hanging_llm) == bound
    finally:
        glue.finalize()
