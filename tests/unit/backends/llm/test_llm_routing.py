"""llm_router's logic without a server: the split of new generations between the primary and the canary
candidate, the fallback when a named version is not loaded, the bounded relay slots, and the relay of one stream."""
import numpy as np
import pytest

from s2t.backends.runtime.serving_errors import InvalidInput, NotServing, Unavailable
from s2t.backends.llm.version_routing import LlmRouterSettings, RelaySlots, Splitter, StreamRefused, relay
from s2t.backends.runtime.model_parameters import ParameterError, read_parameters
from s2t.backends.routing.routing_policy import RoutingSettings, Target
from s2t import triton_config
from tests.conftest import LLM_REPOSITORY

PRIMARY, CANDIDATE = Target("llm", 1), Target("llm", 2)


def split(percent: float) -> Splitter:
    return Splitter(RoutingSettings(PRIMARY, CANDIDATE if percent else None, percent))


def always_ready(_target) -> bool:
    return True


@pytest.mark.parametrize("percent", [0.0, 10.0, 50.0, 100.0])
def test_requests_without_ids_split_by_the_share_over_any_run(percent):
    splitter = split(percent)
    targets = [splitter.target(None, always_ready) for _ in range(2000)]
    share = 100.0 * targets.count(CANDIDATE) / len(targets)
    assert set(targets) <= {PRIMARY, CANDIDATE}
    assert abs(share - percent) <= 3.0


def test_a_request_id_keeps_its_version_whatever_came_before():
    first, second = split(50.0), split(50.0)
    for n in range(50):
        second.target(None, always_ready)  # another history of requests without ids
        assert first.target(f"r-{n}", always_ready) == second.target(f"r-{n}", always_ready)
    assert {first.target(f"r-{n}", always_ready) for n in range(200)} == {PRIMARY, CANDIDATE}


@pytest.mark.parametrize("loaded, expected", [
    ({PRIMARY, CANDIDATE}, CANDIDATE),
    ({PRIMARY}, PRIMARY),  # the candidate was unloaded under a split still in force: the primary answers
    (set(), Target("llm")),  # neither named version: the model's newest loaded one
])
def test_a_version_that_is_not_loaded_is_never_called(loaded, expected):
    assert split(100.0).target("r-1", lambda target: target in loaded) == expected


@pytest.mark.parametrize("parameters, message", [
    ({"shadow_percent": "10", "candidate": "llm:2"}, "shadow_percent"),
    ({"fallback": "llm"}, "fallback"),
    ({"max_streams": "0"}, "max_streams must be at least 1"),
    ({"canary_percent": "120", "candidate": "llm:2"}, "canary_percent must be within 0..100"),
    ({"canary_percent": "10"}, "needs a candidate"),
])
def test_settings_that_cannot_work_are_refused_naming_the_parameter(parameters, message):
    given = {"primary": "llm:1", **parameters}
    with pytest.raises(ParameterError, match=message):
        read_parameters(LlmRouterSettings, {k: {"string_value": v} for k, v in given.items()})


def test_the_shipped_config_routes_everything_to_llm_1():
    config = triton_config.load(LLM_REPOSITORY / "llm_router")
    settings = read_parameters(LlmRouterSettings, triton_config.backend_parameters(config))
    assert settings.routing.describe() == "100% llm:1" and settings.max_streams >= 1


def test_relay_slots_refuse_the_stream_over_the_limit_at_once_and_free_on_release():
    slots = RelaySlots(2)
    slots.take()
    slots.take()
    with pytest.raises(StreamRefused, match="2 streams are running") as refused:
        slots.take()
    assert isinstance(refused.value, Unavailable)
    slots.release()
    slots.take()
    assert slots.held == 2


def token(text: str) -> dict:
    return {"text_output": np.array([text.encode()], dtype=object)}


def final(reason: str = "length") -> dict:
    return {"text_output": np.array([b""], dtype=object), "finish_reason": np.array([reason.encode()], dtype=object)}


class Client:
    """What relay does to the caller's stream: partial responses, the final one, an error."""

    def __init__(self, cancel_after: int | None = None):
        self.sent, self.finals, self.errors = [], [], []
        self.cancel_after = cancel_after

    def send(self, outputs):
        self.sent.append(outputs)

    def finish(self, outputs):
        self.finals.append(outputs)

    def fail(self, err):
        self.errors.append(err)

    def cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def relay(self, responses) -> str:
        return relay(responses, "llm:2", self.send, self.finish, self.fail, self.cancelled)


def failing(*responses, error):
    yield from responses
    raise error


def test_a_stream_is_relayed_whole_and_its_last_response_is_the_final_one():
    client = Client()
    assert client.relay(iter([token("a"), token("b"), final()])) == "done"
    assert [o["text_output"][0] for o in client.sent] == [b"a", b"b"]
    (last,) = client.finals
    assert last["finish_reason"][0] == b"length" and client.errors == []
    assert {o["served_by"][0] for o in [*client.sent, last]} == {b"llm:2"}


def test_a_stream_that_ends_without_a_final_response_is_closed_once():
    client = Client()
    assert client.relay(iter([token("a")])) == "done"
    assert client.finals == [None] and len(client.sent) == 1


@pytest.mark.parametrize("before, error", [
    ((), InvalidInput("max_tokens: must be between 1 and 512, got 0")),
    ((), NotServing("llm version 2 is not ready")),
    ((token("a"),), NotServing("the version failed mid-stream")),
])
def test_the_models_error_is_that_callers_one_final_error(before, error):
    client = Client()
    assert client.relay(failing(*before, error=error)) == "failed"
    assert client.errors == [error] and client.finals == [] and len(client.sent) == len(before)


def test_a_caller_that_cancels_gets_its_final_response_and_the_rest_is_read_and_dropped():
    client = Client(cancel_after=1)
    rest = [token("b"), token("c"), final()]
    responses = iter([token("a"), *rest])
    assert client.relay(responses) == "cancelled"
    assert len(client.sent) == 1 and client.finals == [None] and client.errors == []
    assert next(responses, None) is None  # read to its end: the generation was not left half-consumed
