"""llm_router's model.py through the wheel's triton_python_backend_utils, without a server: the version the
split chose is called by a streaming BLS request with the client's inputs, its responses relayed with served_by,
its error passed on, a version that is not loaded never called, and the relay slots bounded."""
import threading

import numpy as np
import pytest
from google.protobuf import json_format

from s2t.triton_config import load
from tests.conftest import LLM_REPOSITORY
from tests.unit import python_backend as backend

ROUTER = LLM_REPOSITORY / "llm_router"
WAIT_S = 30


@pytest.fixture
def pb_utils():
    return backend.backend_utils()


def router(pb_utils, ready=("1", "2"), **parameters):
    """llm_router with its shipped config, `parameters` changed; `ready`: the llm versions loaded."""
    config = json_format.MessageToDict(load(ROUTER), preserving_proto_field_name=True)
    for key, value in parameters.items():
        config["parameters"][key] = {"string_value": value}
    pb_utils.is_model_ready = lambda model, version="": model == "llm" and (version in ready or version == "")
    model = backend.initialize(backend.load_model(ROUTER / "1" / "model.py", pb_utils), ROUTER, config=config)
    return model


def generation(text="Hi.", max_tokens=3):
    return backend.request(text_input=np.array([text.encode()], dtype=object),
                           max_tokens=np.array([max_tokens], dtype=np.int32))


def tokens(*texts, reason="length"):
    responses = [backend.InferenceResponse([backend.Tensor("text_output", np.array([t.encode()], dtype=object))])
                 for t in texts]
    final = [backend.Tensor("text_output", np.array([b""], dtype=object)),
             backend.Tensor("finish_reason", np.array([reason.encode()], dtype=object))]
    return responses + [backend.InferenceResponse(final)]


def answered(request):
    assert request.sender.done.wait(WAIT_S), "no final response"
    return request.sender.sent


@pytest.mark.parametrize("ready, version", [(("1", "2"), 2), (("1",), 1)])
def test_the_chosen_version_streams_through_with_served_by_and_one_final_response(pb_utils, ready, version):
    calls = []
    backend.InferenceRequest.bls["llm"] = lambda bls: calls.append(bls) or iter(tokens("a", "b"))
    model = router(pb_utils, ready, candidate="llm:2", canary_percent="100")
    request = generation()
    assert model.execute([request]) is None
    sent = answered(request)
    (call,) = calls
    assert call.model_version == version  # a candidate that is not loaded is never called: the primary answers
    assert {t.name(): t.as_numpy().tolist() for t in call.inputs()} == {"text_input": [b"Hi."], "max_tokens": [3]}
    assert [r.output("text_output")[0] for r, _ in sent] == [b"a", b"b", b""]
    assert {r.output("served_by")[0] for r, _ in sent} == {f"llm:{version}".encode()}
    assert [flags for _, flags in sent] == [0, 0, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL]
    model.finalize()


def test_llms_refusal_is_that_requests_final_error_with_its_code(pb_utils):
    message = "max_tokens: must be between 1 and 512, got 100000"
    backend.InferenceRequest.bls["llm"] = lambda bls: iter(
        [backend.InferenceResponse(error=backend.TritonError(message, backend.TritonError.INVALID_ARG))])
    model = router(pb_utils)
    request = generation(max_tokens=100000)
    model.execute([request])
    ((response, flags),) = answered(request)
    assert response.error().message() == message and response.error().code() == backend.TritonError.INVALID_ARG
    assert flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    model.finalize()


def test_a_stream_over_max_streams_is_refused_at_once_while_the_running_one_finishes(pb_utils):
    release = threading.Event()

    def held(_bls):
        release.wait(WAIT_S)
        return iter(tokens("a"))
    backend.InferenceRequest.bls["llm"] = held
    model = router(pb_utils, max_streams="1")
    running, refused = generation(), generation()
    model.execute([running, refused])
    ((response, _),) = answered(refused)
    assert response.error().code() == backend.TritonError.UNAVAILABLE and "retry" in response.error().message()
    assert not running.sender.done.is_set()
    release.set()
    assert answered(running)[-1][0].output("finish_reason")[0] == b"length"
    model.finalize()
