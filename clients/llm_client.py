"""Triton's generate_stream endpoint (server-sent events) from Python: one call, every event timed."""
from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    """What one generate_stream call got back; `error` set when the server refused or failed the request."""

    started: float
    events: list[tuple[float, dict]] = field(default_factory=list)
    error: str | None = None
    status: int = 200

    @property
    def text(self) -> str:
        return "".join(e.get("text_output", "") for _, e in self.events)

    @property
    def final(self) -> dict:
        return self.events[-1][1] if self.events else {}

    def token_times(self) -> list[float]:
        return [t for t, e in self.events if e.get("text_output")]

    @property
    def ttft(self) -> float | None:
        times = self.token_times()
        return times[0] - self.started if times else None

    def inter_token_latencies(self) -> list[float]:
        times = self.token_times()
        return [b - a for a, b in zip(times, times[1:])]


def generate_stream(url: str, body: dict, model: str = "llm", timeout: float = 120.0) -> StreamResult:
    """POST /v2/models/<model>/generate_stream on url (HOST:PORT) and read every event until the stream ends."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    result = StreamResult(time.monotonic())
    try:
        connection.request("POST", f"/v2/models/{model}/generate_stream", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        result.status = response.status
        if response.status != 200:
            # Refused before the stream starts: one event (or a plain JSON body) with the error.
            body = response.read().strip()
            body = body[5:] if body.startswith(b"data:") else body
            try:
                result.error = json.loads(body).get("error", f"HTTP {response.status}")
            except ValueError:
                result.error = f"HTTP {response.status}: {body[:200]!r}"
            return result
        for line in response:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                result.error = event["error"]
                break
            result.events.append((time.monotonic(), event))
    finally:
        connection.close()
    return result
