"""llm_router on the real server (the `s2t serve --llm` repositories): its relay slots are bounded. A client that
holds every slot of llm_router_small (llm_router with 2 slots, added to the served repository for this test) gets
the next stream refused at once, alone, while other callers of the language model are answered; once the held
streams end, the router takes streams again."""
import http.client
import json
import re
import shutil
import time

import pytest

from s2t.clients.llm_client import generate_stream
from s2t.serve.triton_server import precompile_models

HELD_TOKENS = 200
# Generous for a busy 2-core machine: the held streams generate HELD_TOKENS each beside other work.
TIMEOUT_S = 180.0


@pytest.fixture
def small_router(triton_llm, tmp_path):
    """llm_router_small in the session server's llm repository (poll mode loads it), removed afterwards."""
    import tritonclient.http as http

    repo = triton_llm.repositories[-1]
    staged = tmp_path / "llm_router_small"
    shutil.copytree(repo / "llm_router", staged, ignore=shutil.ignore_patterns("__pycache__"))
    config = staged / "config.pbtxt"
    config.write_text(re.sub(r'(key: "max_streams" value: \{ string_value: )"[^"]*"', r'\1"2"',
                             config.read_text().replace('name: "llm_router"', 'name: "llm_router_small"')))
    # Bytecode written now, not by the stub on import: the poller would take that for a change and load a new
    # instance (with free slots) beside the one holding the streams.
    precompile_models([tmp_path])
    shutil.move(staged, repo / "llm_router_small")  # one rename: the poller never sees half a folder
    client = http.InferenceServerClient(triton_llm.http_url, network_timeout=30)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not client.is_model_ready("llm_router_small"):
            assert time.monotonic() < deadline, "llm_router_small was not loaded"
            time.sleep(0.2)
        yield "llm_router_small"
    finally:
        client.close()
        shutil.rmtree(repo / "llm_router_small")


class HeldStream:
    """A generate_stream call read up to its first token (its relay slot is taken), then left open."""

    def __init__(self, url: str, model: str, body: dict):
        host, port = url.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        self.connection.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
                                {"Content-Type": "application/json"})
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.read()
        self.events = [self._next()]

    def _next(self) -> dict | None:
        for line in self.response:
            if line.startswith(b"data:"):
                return json.loads(line[5:])
        return None

    def finish(self) -> list[dict]:
        """The rest of the stream, read to its end."""
        while (event := self._next()) is not None:
            self.events.append(event)
        self.connection.close()
        return self.events


def test_a_client_holding_every_relay_slot_gets_the_next_stream_refused_while_others_are_served(triton_llm,
                                                                                                  small_router):
    url = triton_llm.http_url
    # min_length: no early end of sequence, so the held streams outlast the requests below.
    body = {"text_input": "Count from one to one hundred in words.", "max_tokens": HELD_TOKENS,
            "min_length": HELD_TOKENS}
    held = [HeldStream(url, small_router, body) for _ in range(2)]
    try:
        refused = generate_stream(url, {"text_input": "Hi.", "max_tokens": 2}, model=small_router)
        beside = generate_stream(url, {"text_input": "Say hi.", "max_tokens": 4}, model="llm_router",
                                 timeout=TIMEOUT_S)
    finally:
        streams = [stream.finish() for stream in held]
    after = generate_stream(url, {"text_input": "Say hi.", "max_tokens": 4}, model=small_router, timeout=TIMEOUT_S)

    assert "2 streams are running; retry" in (refused.error or "") and refused.events == []
    assert beside.error is None and beside.final.get("finish_reason") in ("length", "stop")
    for events in streams:  # the held streams were never cut: each ends with its final response
        assert "error" not in events[-1] and events[-1].get("finish_reason") in ("length", "stop")
    assert after.error is None and after.final.get("served_by") == "llm:1"
