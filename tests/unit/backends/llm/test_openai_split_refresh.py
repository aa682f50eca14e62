"""The OpenAI API refreshes llm_router's split beside the requests, not in front of them: once a split is known, a
request never waits for the next read of it (a round trip to Triton in its time to first token), and the split read
in the background is followed by the requests after it. Against a stand-in for Triton whose router config answers
slowly (a real aiohttp server on a free port)."""
from __future__ import annotations

import asyncio
import time

from s2t.serve import openai_server
from s2t.serve.openai_server import OpenAIFrontend
from s2t.serve.triton_server import free_port
from tests.unit.serve.test_openai_split import CANARY, SplitTriton, complete

CONFIG_DELAY_S = 0.4


class SlowConfigTriton(SplitTriton):
    async def config(self, request):
        self.config_reads = getattr(self, "config_reads", 0) + 1
        await asyncio.sleep(CONFIG_DELAY_S)
        return await super().config(request)


def test_only_the_first_request_waits_for_the_split_and_later_reads_are_followed(monkeypatch):
    monkeypatch.setattr(openai_server, "SPLIT_REFRESH_S", 0.2)
    with SlowConfigTriton({1, 2}, {**CANARY, "canary_percent": "0", "candidate": ""}) as triton:
        api = OpenAIFrontend(f"127.0.0.1:{triton.port}", free_port(), host="127.0.0.1").start()
        try:
            first = time.monotonic()
            assert complete(api)["system_fingerprint"] == "llm:1"
            assert time.monotonic() - first >= CONFIG_DELAY_S  # nothing known yet: this one waits for the read
            triton.split = {**CANARY, "canary_percent": "100"}
            waits, answers = [], []
            deadline = time.monotonic() + 10
            while "llm:2" not in answers and time.monotonic() < deadline:
                time.sleep(0.25)  # past the refresh period: each request starts a read beside it
                began = time.monotonic()
                answers.append(complete(api)["system_fingerprint"])
                waits.append(time.monotonic() - began)
            assert answers[0] == "llm:1" and answers[-1] == "llm:2"  # the read a request started, followed after it
            assert max(waits) < CONFIG_DELAY_S and triton.config_reads >= 2
        finally:
            api.stop()
