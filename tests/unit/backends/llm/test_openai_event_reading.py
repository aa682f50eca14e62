"""The OpenAI API reads Triton's generate_stream events by network read, not by line: several events in one read,
an event cut across reads and a last line without its newline each give the same tokens, in order, as one event a
read (a stand-in for Triton: a real aiohttp server on a free port, its writes flushed one by one)."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from aiohttp import web

from s2t.serve.openai_server import MAX_EVENT_BYTES, OpenAIFrontend
from s2t.serve.triton_server import free_port
from tests.unit.background_app import BackgroundApp

TOKENS = [f"t{n} " for n in range(12)] + ["é \u2028 \"quoted\"\n"]
FINAL = {"text_output": "", "input_tokens": 5, "output_tokens": len(TOKENS), "finish_reason": "length",
         "model_name": "llm", "model_version": "1"}


def stream_bytes() -> bytes:
    return b"".join(b"data: " + json.dumps({"text_output": t}).encode() + b"\n\n" for t in TOKENS) + \
        b"data: " + json.dumps(FINAL).encode() + b"\n\n"


# How the stream is cut into writes: one event each, everything at once, odd cuts through lines, no last newline.
SCENARIOS = {
    "one event a write": lambda raw: [e + b"\n\n" for e in raw.split(b"\n\n") if e],
    "all in one write": lambda raw: [raw],
    "cut every 7 bytes": lambda raw: [raw[i:i + 7] for i in range(0, len(raw), 7)],
    "no last newline": lambda raw: [raw.rstrip(b"\n")],
    "oversized line": lambda raw: [b"data: {\"text_output\": \"" + b"x" * MAX_EVENT_BYTES],
}


class CuttingTriton(BackgroundApp):
    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        scenario = (await request.json())["text_input"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in SCENARIOS[scenario](stream_bytes()):
            await response.write(piece)
            await asyncio.sleep(0.002)  # each write its own network read
        return response

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v2/models/llm/generate_stream", self.generate_stream)


@pytest.fixture(scope="module")
def frontend():
    with CuttingTriton() as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        try:
            yield api
        finally:
            api.stop()


def complete(api: OpenAIFrontend, scenario: str, stream: bool):
    body = {"model": "llm", "prompt": scenario, "stream": stream, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(f"http://127.0.0.1:{api.port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "oversized line"])
def test_tokens_arrive_whole_and_in_order_however_the_reads_cut_them(frontend, scenario):
    status, raw = complete(frontend, scenario, stream=True)
    assert status == 200
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert texts == TOKENS
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 13
    status, whole = complete(frontend, scenario, stream=False)
    assert status == 200 and json.loads(whole)["choices"][0]["text"] == "".join(TOKENS)


def test_an_event_line_over_the_bound_is_the_servers_error_not_a_growing_buffer(frontend):
    status, raw = complete(frontend, "oversized line", stream=False)
    assert status == 502 and "over" in json.loads(raw)["error"]["message"]
