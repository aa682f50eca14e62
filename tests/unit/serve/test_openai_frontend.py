"""The OpenAI frontend against a stand-in for Triton's generate_stream (a real aiohttp server on a free port): how a
refusal, a malformed event and a connection lost mid-stream reach the caller, and that stop() never raises."""
from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from s2t.serve.openai_server import OpenAIFrontend
from s2t.serve.triton_server import free_port
from tests.unit.background_app import BackgroundApp

GOOD_EVENT = b'data: {"text_output": "Hi"}\n\n'


class FakeTriton(BackgroundApp):
    """generate_stream answers as the scenario named in the prompt says."""

    def __init__(self):
        super().__init__()
        self.hanging = threading.Event()  # set once a "hang" generation is in flight

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        scenario = (await request.json())["text_input"]
        if scenario == "refuse":
            return web.json_response({"error": "max_tokens: must be at most 64"}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(GOOD_EVENT)
        if scenario == "malformed":
            await response.write(b"data: {not json\n\n")
        elif scenario == "drop":
            request.transport.close()  # the connection lost mid-stream: the reader sees a payload error
        elif scenario == "hang":
            self.hanging.set()
            await asyncio.sleep(3600)
        return response

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/models/llm/generate_stream", self.generate_stream)


@pytest.fixture
def frontend():
    with FakeTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        try:
            yield api
        finally:
            api.stop()


def post(api: OpenAIFrontend, scenario: str, stream: bool, timeout: float = 60):
    body = {"model": "llm", "prompt": scenario, "max_tokens": 4, "stream": stream}
    request = urllib.request.Request(f"http://127.0.0.1:{api.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout)


def events(raw: bytes) -> list:
    return [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_passes_tritons_message_on_naming_the_field(frontend, stream):
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(frontend, "refuse", stream)
    assert refused.value.code == 400
    error = json.loads(refused.value.read())["error"]
    assert error["message"] == "max_tokens: must be at most 64" and error["param"] == "max_tokens"


@pytest.mark.parametrize("scenario, message", [("malformed", "malformed event"), ("drop", "cannot be reached")])
def test_a_failure_mid_stream_ends_the_event_stream_with_an_error_event_then_done(frontend, scenario, message):
    with post(frontend, scenario, stream=True) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        sent = events(response.read())
    assert json.loads(sent[0])["choices"][0]["text"] == "Hi"
    error = json.loads(sent[1])["error"]
    assert message in error["message"] and error["type"] == "server_error"
    assert sent[2:] == ["[DONE]"]


@pytest.mark.parametrize("scenario", ["malformed", "drop"])
def test_a_failure_without_streaming_is_one_json_error(frontend, scenario):
    with pytest.raises(urllib.error.HTTPError) as failed:
        post(frontend, scenario, stream=False)
    assert failed.value.code in (502, 503)
    assert json.loads(failed.value.read())["error"]["type"] == "server_error"


def read_until_cut(api: OpenAIFrontend) -> None:
    try:
        with post(api, "hang", stream=True, timeout=30) as response:
            response.read()
    except (OSError, http.client.HTTPException):  # stop() cuts the hanging stream: what the caller sees then is not this test's claim
        pass


def test_stop_returns_without_raising_while_a_generation_hangs():
    with FakeTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        caller = threading.Thread(target=read_until_cut, args=(api,), daemon=True)
        caller.start()
        assert triton.hanging.wait(30)  # the call is in flight through the frontend
        started = time.monotonic()
        api.stop(timeout=0.5)  # below the runner's shutdown timeout: cleanup cannot finish in time
        assert time.monotonic() - started < 10
        assert not api._thread.is_alive() and api._loop.is_closed()
        caller.join(30)
