"""The OpenAI frontend and llm_router's split, against a stand-in for Triton (a real aiohttp server on a free port):
the version the split picks is called by name, a version unloaded since the split was read gives way to the
newest loaded one, and without a router the call names no version."""
from __future__ import annotations

import json
import urllib.request

import pytest
from aiohttp import web

from s2t.serve.openai_server import OpenAIFrontend
from s2t.serve.triton_server import free_port
from tests.unit.background_app import BackgroundApp


class SplitTriton(BackgroundApp):
    """llm versions `loaded`; llm_router's config with `split` (None: no router). Records each generate call's path."""

    def __init__(self, loaded: set[int], split: dict[str, str] | None):
        self.loaded, self.split, self.calls = loaded, split, []
        super().__init__()

    async def config(self, _request):
        if self.split is None:
            return web.json_response({"error": "Request for unknown model: 'llm_router'"}, status=400)
        return web.json_response({"name": "llm_router",
                                  "parameters": {k: {"string_value": v} for k, v in self.split.items()}})

    async def ready(self, request):
        return web.Response(status=200 if int(request.match_info["version"]) in self.loaded else 400)

    async def generate(self, request):
        version = request.match_info.get("version")
        self.calls.append(version)
        if version is not None and int(version) not in self.loaded:
            return web.json_response({"error": f"Request for unknown model: 'llm' version {version} is not found"},
                                     status=400)
        answered = version or str(max(self.loaded))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        final = {"model_name": "llm", "model_version": answered, "text_output": "", "finish_reason": "length",
                 "input_tokens": 3, "output_tokens": 1}
        await response.write(f"data: {json.dumps(final)}\n\n".encode())
        return response

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v2/models/llm_router/config", self.config)
        app.router.add_get("/v2/models/llm/versions/{version}/ready", self.ready)
        app.router.add_post("/v2/models/llm/versions/{version}/generate_stream", self.generate)
        app.router.add_post("/v2/models/llm/generate_stream", self.generate)


def complete(api: OpenAIFrontend) -> dict:
    body = {"model": "llm", "prompt": "Hi.", "max_tokens": 1}
    request = urllib.request.Request(f"http://127.0.0.1:{api.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture
def serve():
    started = []

    def start(loaded, split):
        triton = SplitTriton(loaded, split).__enter__()
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        started.append((triton, api))
        return triton, api
    yield start
    for triton, api in started:
        api.stop()
        triton.__exit__()


CANARY = {"primary": "llm:1", "candidate": "llm:2", "canary_percent": "50", "shadow_percent": "0"}


@pytest.mark.parametrize("loaded, split, called, answered", [
    ({1, 2}, CANARY, {"1", "2"}, {"llm:1", "llm:2"}),  # the split, each version named
    ({1, 2}, {**CANARY, "canary_percent": "0", "candidate": ""}, {"1"}, {"llm:1"}),  # the primary named: never newest
    ({1, 2}, None, {None}, {"llm:2"}),  # no router: unversioned, as before
])
def test_completions_name_the_version_the_routers_split_picks(serve, loaded, split, called, answered):
    triton, api = serve(loaded, split)
    fingerprints = {complete(api)["system_fingerprint"] for _ in range(8)}
    assert set(triton.calls) == called and fingerprints == answered


def test_a_version_unloaded_since_the_split_was_read_gives_way_to_the_newest_loaded(serve):
    triton, api = serve({1, 2}, {**CANARY, "canary_percent": "100"})
    assert complete(api)["system_fingerprint"] == "llm:2"
    triton.loaded = {1}  # unloaded within the frontend's refresh period: its split still names version 2
    assert complete(api)["system_fingerprint"] == "llm:1"
    assert triton.calls == ["2", "2", None]
