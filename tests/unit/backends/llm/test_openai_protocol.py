"""OpenAI requests into `llm`'s generate_stream bodies, and `llm`'s answers into OpenAI's shapes."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2t.backends.llm.openai_protocol import (OpenAIError, chat_prompt, finish_reason, parse_request, triton_error_text,
                                              upstream_error, usage)

MODELS = ("llm",)


def parse(body: dict, chat=True):
    return parse_request(json.dumps(body).encode(), chat, MODELS)


def test_a_chat_request_becomes_a_streamed_generation_with_its_settings():
    request = parse({"model": "llm", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                     "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": ["\n", ""], "stream": True,
                     "stream_options": {"include_usage": True}})
    assert request.triton_body() == {"text_input": "Hi", "stream": True, "max_tokens": 8, "temperature": 0.5,
                                     "top_p": 0.9, "seed": 3, "stop_words": ["\n"]}
    assert request.stream and request.include_usage
    assert parse({"model": "llm", "messages": [{"role": "user", "content": "Hi"}],
                  "max_completion_tokens": 4}).max_tokens == 4


def test_a_completion_takes_one_prompt_and_leaves_unset_settings_to_the_model():
    request = parse({"model": "llm", "prompt": ["Say hi."]}, chat=False)
    assert request.triton_body() == {"text_input": "Say hi.", "stream": True} and not request.stream


@pytest.mark.parametrize("messages, prompt", [
    ([{"role": "user", "content": "Hi"}], "Hi"),
    ([{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}], "Hi there"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "system: Be brief.\nuser: Hi"),
])
def test_a_conversation_is_one_prompt(messages, prompt):
    assert chat_prompt(messages) == prompt


@pytest.mark.parametrize("body, status, param", [
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "llm"}, 400, "messages"),
    ({"model": "llm", "messages": []}, 400, "messages"),
    ({"model": "llm", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "llm", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"model": "llm", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
    ({"model": "llm", "messages": [{"role": "assistant", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "llm", "messages": [{"role": "user", "content": "  "}]}, 400, "messages"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "top_p": 2}, 400, "top_p"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "n"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, 400, "stop"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "stop": 7}, 400, "stop"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"model": "llm", "messages": [{"role": "user", "content": "x"}], "stream_options": 1}, 400, "stream_options"),
])
def test_bad_requests_name_the_parameter_in_openais_error_shape(body, status, param):
    with pytest.raises(OpenAIError) as raised:
        parse(body)
    error = raised.value.body()["error"]
    assert raised.value.status == status and error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"] or status == 404


@pytest.mark.parametrize("raw, status", [(b"{not json", 400), (b"[1]", 400), (b" " * 70_000, 413)])
def test_a_body_that_is_not_a_json_object_is_refused(raw, status):
    with pytest.raises(OpenAIError) as raised:
        parse_request(raw, True, MODELS)
    assert raised.value.status == status


@pytest.mark.parametrize("status, message, expected, kind", [
    (400, "llm: the admission queue is full (64 requests waiting for 8 slots); retry in a few seconds", 429,
     "rate_limit_error"),
    (400, "text_input: 1501 tokens, over the limit of 1024", 400, "invalid_request_error"),
    (500, "llm: internal error", 502, "server_error"),
])
def test_the_models_refusals_map_to_openai_statuses(status, message, expected, kind):
    error = upstream_error(status, message)
    assert (error.status, error.kind) == (expected, kind)


def test_answers_take_openais_shapes_with_usage_and_finish_reason():
    final = {"input_tokens": 30, "output_tokens": 4, "finish_reason": "length"}
    chat = parse({"model": "llm", "messages": [{"role": "user", "content": "x"}]})
    whole = chat.whole("Hi there", finish_reason(final), usage(final))
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hi there"}
    assert whole["usage"] == {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
    assert chat.chunk("Hi")["choices"][0]["delta"] == {"content": "Hi"}
    assert chat.chunk("", "stop")["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    text = parse({"model": "llm", "prompt": "x"}, chat=False)
    assert text.chunk("Hi")["object"] == "text_completion" and text.chunk("Hi")["choices"][0]["text"] == "Hi"
    assert finish_reason({"finish_reason": "cancelled"}) == "stop"


@pytest.mark.parametrize("status, body, text", [
    (400, b'{"error": "max_tokens: must be at most 64"}', "max_tokens: must be at most 64"),
    (503, b'{"error": "the admission queue is full"}', "the admission queue is full"),
    (502, b"<html>Bad Gateway</html>", "HTTP 502 from Triton"),
    (500, b"", "HTTP 500 from Triton"),
    (400, b'data: {"error": "max_tokens: must be positive"}\n\n', "max_tokens: must be positive"),
    (400, b'["not", "an object"]', "HTTP 400 from Triton"),
    (400, b'{"error": ""}', "HTTP 400 from Triton"),
])
def test_tritons_refusal_text_is_its_json_error_else_the_status(status, body, text):
    assert triton_error_text(status, body) == text


@given(st.text(max_size=40), st.booleans())
@settings(max_examples=200, deadline=None)
def test_a_token_event_is_the_chunks_json_with_its_envelope_serialised_once(text, chat):
    request = parse({"model": "llm", "stream": True, **({"messages": [{"role": "user", "content": "Hi"}]} if chat
                                                         else {"prompt": "Hi"})}, chat=chat)
    for piece in (text, "x", text):
        assert request.token_event(piece) == b"data: " + json.dumps(request.chunk(piece)).encode() + b"\n\n"
