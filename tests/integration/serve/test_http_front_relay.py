"""What the HTTP front relays to Triton's own HTTP endpoint, and the front's part in tritonserver's stop: a streamed
answer (generate_stream, which the OpenAI-compatible API uses) reaches its client as Triton makes it, and a client that
leaves cancels its generation, as when Triton's port was public; requests in flight at SIGTERM are answered through
the front while Triton drains, and generations still streaming then are cut in time for Triton to stop cleanly."""
from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
import urllib.request

import requests

from tests.conftest import LLM_REPOSITORY
from tests.integration.servers import triton_server

STORY = "Write a long story about a bank."


def cancelled(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        return sum(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                   if line.startswith("s2t_llm_requests_total") and 'outcome="cancelled"' in line)


def open_stream(port: int, max_tokens: int) -> socket.socket:
    """A generate_stream request sent on a raw connection (its answer is read as it comes)."""
    body = json.dumps({"text_input": STORY, "stream": True, "max_tokens": max_tokens}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: front\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return sock


def read_until(sock: socket.socket, done, limit_s: float = 60) -> bytes:
    data = b""
    deadline = time.monotonic() + limit_s
    while not done(data) and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def ended(data: bytes) -> bool:
    return data.endswith(b"\r\n0\r\n\r\n")


def test_a_relayed_stream_comes_as_it_is_made_and_a_client_that_leaves_cancels_its_generation(triton_llm):
    pid = triton_llm.process.pid
    before = cancelled(triton_llm.metrics_port)
    beside: list[int] = []

    def valid_traffic():
        with requests.Session() as session:
            for _ in range(6):
                beside.append(session.post(f"http://127.0.0.1:{triton_llm.http_port}/v2/models/llm/generate",
                                           json={"text_input": "Hello", "max_tokens": 2}, timeout=60).status_code)

    traffic = threading.Thread(target=valid_traffic)
    traffic.start()
    sock = open_stream(triton_llm.http_port, max_tokens=400)
    # Two tokens in, the generation (400 tokens) still running: the front passes on what Triton has sent so far.
    data = read_until(sock, lambda d: d.count(b"data:") >= 2)
    sock.close()
    traffic.join(120)
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    assert data.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head, data[:300]
    assert data.count(b"data:") >= 2 and not ended(data), "the stream was held back until its end"
    deadline = time.monotonic() + 30
    while cancelled(triton_llm.metrics_port) <= before and time.monotonic() < deadline:
        time.sleep(0.25)
    assert cancelled(triton_llm.metrics_port) == before + 1
    assert beside == [200] * 6
    assert triton_llm.process.poll() is None and triton_llm.process.pid == pid


def test_at_sigterm_requests_in_flight_are_answered_and_streams_still_running_are_cut_cleanly(built_artifacts,
                                                                                              tmp_path):
    """Two generations streaming through the front and a keep-alive caller at SIGTERM: the caller's requests, the one
    in flight and the next on its connection, are answered while Triton waits for its connections; the streams are
    cut before Triton's HTTP front end stops waiting (a generation still answering then crashed tritonserver 2.51),
    and tritonserver exits 0."""
    log = tmp_path / "tritonserver.log"
    server = triton_server([LLM_REPOSITORY], log, exit_timeout_seconds=10, stop_gracefully=True)
    server.start(timeout=180)
    try:
        port = server.http_port
        streams = [open_stream(port, max_tokens=512) for _ in range(2)]
        heads = [read_until(s, lambda d: b"data:" in d, 60) for s in streams]
        assert all(h.startswith(b"HTTP/1.1 200") for h in heads), [h[:80] for h in heads if
                                                                   not h.startswith(b"HTTP/1.1 200")]
        answers: list[int] = []
        session = requests.Session()
        model = f"http://127.0.0.1:{port}/v2/models/llm"
        assert session.get(model, timeout=30).status_code == 200  # the caller's connection (and its relay's) open
        in_flight = threading.Thread(target=lambda: answers.append(
            session.post(f"{model}/generate", json={"text_input": "Hello", "max_tokens": 2}, timeout=60).status_code))
        in_flight.start()
        server.process.send_signal(signal.SIGTERM)
        in_flight.join(60)
        time.sleep(0.5)
        # Triton's HTTP front end refuses new connections now; the caller's own connection still carries requests.
        answers.append(session.get(model, timeout=30).status_code)
        session.close()
        # Each stream ends (cut: its connection closed) well before Triton's exit timeout.
        started = time.monotonic()
        for s in streams:
            read_until(s, ended, 30)
            s.close()
        assert time.monotonic() - started < 15
        assert server.process.wait(60) == 0, log.read_text()[-3000:]
    finally:
        server.stop()
    text = log.read_text()
    assert answers == [200, 200]
    assert re.search(r"Found [1-9][0-9]* HTTP service connections", text)
    assert "Signal (11)" not in text and "Segmentation fault" not in text


def test_seventy_generations_streaming_at_sigterm_let_tritonserver_stop_cleanly(built_artifacts, tmp_path):
    """70 generate_stream requests through the front at SIGTERM (8 generating, the rest in the admission queue or
    refused by it): Triton's HTTP front end, had it stopped waiting with them still running, would free what their
    next token is written with (tritonserver 2.51 then dies of SIGSEGV); the front cuts them in time."""
    log = tmp_path / "tritonserver.log"
    server = triton_server([LLM_REPOSITORY], log, exit_timeout_seconds=10, stop_gracefully=True)
    server.start(timeout=180)
    try:
        streams = [open_stream(server.http_port, max_tokens=512) for _ in range(70)]
        time.sleep(3)
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(60)
        for s in streams:
            s.close()
    finally:
        server.stop()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Signal (11)" not in text
    assert re.search(r"Found [1-9][0-9]* HTTP service connections", text)
