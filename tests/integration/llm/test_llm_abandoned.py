"""Language-model requests whose clients leave cost (almost) nothing, and a full admission queue is answered busy.

A flood of generate_stream requests abandoned 0.1 s after sending, on the HTTP port (through the HTTP front), beside
valid `llm` requests from several threads: the abandoned ones leave the admission queue about when their clients do,
so no valid request is refused as queue-full. A full queue is answered 429 (retry later), not 400, on the HTTP
port's generate endpoints and on the OpenAI API."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from s2t.clients.llm_client import generate_stream
from s2t.serve.openai_server import OpenAIFrontend
from tests.conftest import LLM_REPOSITORY, free_port
from tests.integration.servers import serving, triton_server

# The flood: twice as many abandoned requests as the queue holds, sixteen clients at a time.
FLOOD = 128
FLOOD_CLIENTS = 16
CLIENT_PATIENCE_S = 0.1
VALID_THREADS = 3
# A valid short prompt waits at most for the evaluation step of the long prompts admitted before their clients were
# seen to leave (one step of 512 tokens, under a second on a quiet core; more on a busy machine), never for the flood.
VALID_WAIT_BOUND_S = 20.0
# The abandoned requests are out of the queue within about a second of the last one leaving; the gauge is refreshed
# every second.
DRAIN_BOUND_S = 3.0
# One request whose client leaves while it waits for a slot is answered (cancelled) well within a second.
ABANDONED_WAIT_BOUND_S = 0.6


def llm_repository(tmp_path, **settings):
    repository = tmp_path / "model_repository_llm"
    shutil.copytree(LLM_REPOSITORY / "llm", repository / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / "llm" / "config.pbtxt"
    text = config.read_text()
    for key, value in settings.items():
        text, count = re.subn(rf'(key: "{key}"\s*value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert count == 1, key
    config.write_text(text)
    return repository


def long_prompt(n: int) -> str:
    words = ("applicant", "loan", "repaid", "savings", "house", "credit", "months", "bank")
    return f"Case {n}: " + " ".join(words[(n + i) % len(words)] for i in range(500))


def abandon(port: int, n: int) -> None:
    """A long generation asked for on a raw socket, the socket closed CLIENT_PATIENCE_S after sending."""
    body = json.dumps({"text_input": long_prompt(n), "max_tokens": 512}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(CLIENT_PATIENCE_S)


def idle_gauges(metrics_port: int) -> bool:
    """Nothing queued or generating, as the gauges (refreshed every second) last said."""
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        return not any(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                       if line.startswith(("s2t_llm_queue_depth{", "s2t_llm_active_slots{")))


def refused(metrics_port: int) -> float:
    """Requests refused so far (the queue full), as counted when refused."""
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        return sum(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                   if line.startswith("s2t_llm_requests_total") and 'outcome="refused"' in line)


def queue_depth(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("s2t_llm_queue_depth{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no s2t_llm_queue_depth in the metrics")


@pytest.fixture(scope="module")
def flood_server(built_artifacts, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("llm_abandoned")
    with serving(triton_server([llm_repository(tmp_path)], log_path=tmp_path / "tritonserver.log")) as server:
        yield server


def test_abandoned_streams_leave_the_queue_and_valid_requests_beside_them_are_served(flood_server):
    server = flood_server
    pid = server.process.pid
    flooding = threading.Event()
    flooding.set()
    valid = []

    def valid_client(k: int):
        n = 0
        while flooding.is_set():
            started = time.monotonic()
            result = generate_stream(server.http_url, {"text_input": f"Say hi {k}-{n}.", "max_tokens": 4}, timeout=120)
            valid.append((result, time.monotonic() - started))
            n += 1
            time.sleep(0.2)

    refused_before = refused(server.metrics_port)
    with ThreadPoolExecutor(VALID_THREADS) as valid_pool:
        clients = [valid_pool.submit(valid_client, k) for k in range(VALID_THREADS)]
        time.sleep(0.3)
        with ThreadPoolExecutor(FLOOD_CLIENTS) as pool:
            list(pool.map(lambda n: abandon(server.http_port, n), range(FLOOD)))
        last_left = time.monotonic()
        depths = []
        while time.monotonic() - last_left < DRAIN_BOUND_S:
            depths.append(queue_depth(server.metrics_port))
            time.sleep(0.25)
        refused_in_flood = refused(server.metrics_port) - refused_before
        flooding.clear()
        for client in clients:
            client.result()

    failed = [(r.status, r.error) for r, _ in valid if r.error is not None]
    assert not failed, f"{len(failed)} of {len(valid)} valid requests refused beside the flood: {failed[:3]}"
    # The abandoned requests left the queue about when their clients did: it never filled, not one request (of the
    # flood or not) was refused as queue-full.
    assert refused_in_flood == 0, f"{refused_in_flood:.0f} requests refused as queue-full during the flood"
    assert all(r.final["output_tokens"] == 4 for r, _ in valid)
    slowest = max(wait for _, wait in valid)
    assert slowest < VALID_WAIT_BOUND_S, f"a valid request waited {slowest:.1f} s beside the flood"
    # Only the valid requests may still wait (behind the long prompts admitted before their clients were seen to
    # leave); every abandoned one has left the queue.
    assert depths[-1] <= VALID_THREADS, f"queue depth {depths} in the {DRAIN_BOUND_S} s after the last client left"
    assert server.process.poll() is None and server.process.pid == pid


def test_a_long_prompt_whose_client_leaves_while_queued_goes_before_it_is_admitted(flood_server):
    """One abandoned request behind a busy slot is answered (cancelled) within about a second, not when the slot
    frees: seen by the next valid request, which is not kept waiting for it."""
    server = flood_server
    metrics = f"http://localhost:{server.metrics_port}/metrics"

    def cancelled() -> float:
        with urllib.request.urlopen(metrics, timeout=10) as response:
            return sum(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                       if line.startswith("s2t_llm_requests_total") and 'outcome="cancelled"' in line)

    settle_by = time.monotonic() + 60
    while idle_gauges(server.metrics_port) is False:
        assert time.monotonic() < settle_by, "the earlier test's requests are still running"
        time.sleep(0.25)
    before = cancelled()
    with ThreadPoolExecutor(9) as pool:
        # Every slot busy with a long answer, so that the abandoned request waits in the queue: 8 answers of 96
        # tokens keep them busy several seconds on a quiet machine (longer on a busy one), the test needs about two.
        busy = [pool.submit(generate_stream, server.http_url,
                            {"text_input": f"Write a long story {n}.", "max_tokens": 96,
                             "sampling_parameters": json.dumps({"min_tokens": 96})}, "llm", 300) for n in range(8)]
        time.sleep(1.0)
        left_at = time.monotonic() + CLIENT_PATIENCE_S
        abandon(server.http_port, 1000)
        while cancelled() == before:
            assert time.monotonic() - left_at < ABANDONED_WAIT_BOUND_S, "the abandoned request is still waiting"
            time.sleep(0.05)
        assert not any(f.done() for f in busy), "every slot was still busy when the abandoned request was answered"
        assert all(f.result().error is None for f in busy)


@pytest.fixture(scope="module")
def busy_server(built_artifacts, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("llm_busy")
    repository = llm_repository(tmp_path, max_queue_size=2, slots=1)
    with serving(triton_server([repository], log_path=tmp_path / "tritonserver.log")) as server:
        yield server


def generate(url: str, body: dict) -> tuple[int, str | None, dict]:
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", "/v2/models/llm/generate", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read()).get("error"), dict(response.getheaders())
    finally:
        connection.close()


def test_a_full_queue_is_answered_busy_on_the_http_port_and_the_openai_api(busy_server):
    server = busy_server
    pid = server.process.pid
    port = free_port()
    frontend = OpenAIFrontend(server.http_url, port).start()
    sdk = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", timeout=120, max_retries=0)
    long_answer = {"max_tokens": 192, "sampling_parameters": json.dumps({"min_tokens": 192})}
    try:
        with ThreadPoolExecutor(3) as pool:
            # The slot and the two places of the queue taken by clients that stay.
            held = [pool.submit(generate_stream, server.http_url, {"text_input": f"Tell a story {n}.", **long_answer},
                                "llm", 300) for n in range(3)]
            time.sleep(1.5)
            stream = generate_stream(server.http_url, {"text_input": "Say hi.", "max_tokens": 2})
            status, error, headers = generate(server.http_url, {"text_input": "Say hi.", "max_tokens": 2,
                                                                "stream": False})
            with pytest.raises(openai.RateLimitError) as refused:
                sdk.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=2)
            assert all(f.result().error is None for f in held)
    finally:
        frontend.stop()
    assert stream.status == 429 and "admission queue is full" in stream.error and "retry" in stream.error, \
        (stream.status, stream.error)
    assert status == 429 and "admission queue is full" in error and headers.get("Retry-After") == "1", \
        (status, error, headers)
    assert refused.value.status_code == 429
    body = refused.value.body
    assert body["type"] == "rate_limit_error" and "admission queue is full" in body["message"], body
    # The queue frees once the held requests end: the next request is served.
    assert generate_stream(server.http_url, {"text_input": "Say hi.", "max_tokens": 2}).error is None
    assert server.process.poll() is None and server.process.pid == pid
