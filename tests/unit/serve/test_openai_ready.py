"""OpenAIFrontend.start() returns once its port has answered a request: `s2t serve` prints `ready:` after it, so a
client that calls the API the moment it reads that line is answered."""
from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from aiohttp import web

from s2t.serve.openai_server import OpenAIFrontend
from s2t.serve.triton_server import free_port
from tests.unit.background_app import BackgroundApp


class ReadyTriton(BackgroundApp):
    """Triton's readiness endpoint, counting its calls."""

    def __init__(self):
        super().__init__()
        self.readiness_calls = 0
        self._lock = threading.Lock()

    async def ready(self, _request: web.Request) -> web.Response:
        with self._lock:
            self.readiness_calls += 1
        return web.Response()

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v2/health/ready", self.ready)


def models(api: OpenAIFrontend) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{api.port}/v1/models", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_start_returns_once_a_request_has_gone_through_the_api_to_triton():
    with ReadyTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        try:
            # Before any caller of ours: start() itself had /v1/models answered, which asks Triton.
            assert triton.readiness_calls >= 1
            status, body = models(api)
            assert status == 200 and [m["id"] for m in body["data"]] == ["llm"]
        finally:
            api.stop()


def test_start_returns_when_triton_is_not_ready_the_api_answering_503():
    api = OpenAIFrontend(f"127.0.0.1:{free_port()}", free_port(), host="127.0.0.1").start()
    try:
        status, body = models(api)
        assert status == 503 and body["error"]["message"] == "the model server is not ready"
    finally:
        api.stop()


def test_start_on_every_address_answers_on_loopback():
    with ReadyTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port()).start()
        try:
            assert models(api)[0] == 200
        finally:
            api.stop()


def test_port_zero_serves_on_the_port_the_system_chose():
    with ReadyTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", 0, host="127.0.0.1").start()
        try:
            assert api.port != 0 and models(api)[0] == 200
        finally:
            api.stop()


def test_a_port_taken_fails_the_start_naming_the_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"the OpenAI API could not start on port {port}"):
            OpenAIFrontend(f"127.0.0.1:{free_port()}", port, host="127.0.0.1").start(timeout=10)
