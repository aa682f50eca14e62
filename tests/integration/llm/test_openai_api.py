"""The OpenAI-compatible API in front of the real `llm`, called with the official `openai` SDK: chat and completions,
streamed and not, usage, stop sequences, seeds, errors in OpenAI's shape, concurrent clients, and a client that
leaves mid-stream (its generation stops)."""
from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from s2t.serve.openai_server import OpenAIFrontend
from tests.conftest import free_port
from tests.integration.servers import wait_ready

PROMPT = "What is credit risk? Answer in one sentence."


@pytest.fixture(scope="module")
def client(triton_llm):
    wait_ready(triton_llm)  # the session's server, as another module may have left it mid-unload
    port = free_port()
    frontend = OpenAIFrontend(triton_llm.http_url, port).start()
    sdk = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", timeout=120, max_retries=0)
    yield sdk
    sdk.close()
    frontend.stop()


def chat(sdk, content=PROMPT, model="llm", **options):
    return sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **options)


def test_the_sdk_lists_the_model_and_gets_a_chat_completion_and_a_completion_with_usage(client):
    assert [m.id for m in client.models.list()] == ["llm"]
    answer = chat(client, max_tokens=8)
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content and answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 5
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 8
    completion = client.completions.create(model="llm", prompt=PROMPT, max_tokens=5)
    assert completion.object == "text_completion" and completion.choices[0].text
    assert completion.usage.completion_tokens == 5


def test_stop_sequences_and_seeds_steer_the_answer(client):
    plain = chat(client, max_tokens=16).choices[0].message.content
    words = plain.split()
    stopped = chat(client, max_tokens=16, stop=[words[3]])
    assert stopped.choices[0].finish_reason == "stop" and plain.startswith(stopped.choices[0].message.content)
    assert stopped.usage.completion_tokens < 16
    seeded = [chat(client, max_tokens=6, temperature=1.0, seed=7).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_streams_come_token_by_token_with_usage_last(client):
    """A chunk per token as it is made; tokens made while the previous ones still wait to be sent (a busy machine)
    come together in one chunk. Greedy answers: the chunks together are the answer the same request gets whole."""
    chunks = list(chat(client, max_tokens=6, stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert 1 <= len(texts) <= 6 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(texts) == chat(client, max_tokens=6).choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices
    pieces = [c.choices[0].text for c in client.completions.create(model="llm", prompt=PROMPT, max_tokens=4,
                                                                   stream=True)]
    assert 1 <= len([p for p in pieces if p]) <= 4
    assert "".join(pieces) == client.completions.create(model="llm", prompt=PROMPT, max_tokens=4).choices[0].text


BAD = [
    (dict(model="no-such-model"), openai.NotFoundError, "model"),
    (dict(max_tokens=100000), openai.BadRequestError, "max_tokens"),
    (dict(temperature=5), openai.BadRequestError, "temperature"),
    (dict(n=2), openai.BadRequestError, "n"),
    (dict(stop=["a", "b", "c", "d", "e"]), openai.BadRequestError, "stop"),
]


def test_concurrent_streams_are_served_beside_bad_requests_each_answered_in_openais_shape(client):
    def bad(case):
        options, error, param = case
        with pytest.raises(error) as raised:
            chat(client, **{"max_tokens": 4, **options})
        return raised.value.body, param

    def good(n):
        return "".join(c.choices[0].delta.content or "" for c in chat(client, f"Name {n} colours.", max_tokens=6,
                                                                      stream=True) if c.choices)

    with ThreadPoolExecutor(len(BAD) + 4) as pool:
        refusals = list(pool.map(bad, BAD))
        answers = list(pool.map(good, range(4)))
    for body, param in refusals:
        assert body["param"] == param and (body["message"].startswith(param) or param == "model"), body
        assert body["type"] == "invalid_request_error"
    assert all(answers)


def cancelled(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        return sum(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                   if line.startswith("s2t_llm_requests_total") and 'outcome="cancelled"' in line)


def test_a_client_that_leaves_mid_stream_stops_its_generation(client, triton_llm):
    before = cancelled(triton_llm.metrics_port)
    stream = chat(client, "Write a long story about a bank.", max_tokens=400, stream=True)
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 2:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while cancelled(triton_llm.metrics_port) <= before and time.monotonic() < deadline:
        time.sleep(0.25)
    assert cancelled(triton_llm.metrics_port) == before + 1
    assert chat(client, max_tokens=2).usage.completion_tokens == 2


def test_the_models_list_is_the_readiness_probe_refused_in_openais_shape_while_triton_cannot_serve(client):
    """The deployments probe /v1/models: in front of no ready Triton (still loading, or gone) it answers 503, while
    the API in front of the ready one lists `llm`, side by side."""
    port = free_port()
    unready = OpenAIFrontend(f"localhost:{free_port()}", port).start()
    sdk = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", timeout=30, max_retries=0)
    try:
        def refused(_):
            with pytest.raises(openai.APIStatusError) as caught:
                sdk.models.list()
            return caught.value

        with ThreadPoolExecutor(6) as pool:
            errors = list(pool.map(refused, range(3)))
            listed = list(pool.map(lambda _: [m.id for m in client.models.list()], range(3)))
        for err in errors:
            assert err.status_code == 503 and err.body["type"] == "server_error" and "not ready" in err.body["message"]
        assert listed == [["llm"]] * 3
    finally:
        sdk.close()
        unready.stop()
