"""`llm`'s admission queue under a flood of clients that leave: they leave the queue at once, the queue is bounded,
a short valid prompt beside them still gets its first token soon, and the server then stops cleanly (the last test:
it stops this module's server)."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from s2t.clients.llm_client import generate_stream
from tests.conftest import LLM_REPOSITORY
from tests.integration.servers import serving, triton_server

QUEUE_SIZE = 16
SLOTS = 8
# More than the slots and the queue together: some must be refused, whatever the timing.
FLOOD = 64
CLIENT_PATIENCE_S = 0.1
RETRIES = 20
# At most max_prefill_tokens of long prompts (admitted before their clients were seen to leave) are evaluated before
# the short prompt: a few seconds, more on a busy machine. Without cancellation in the queue it waits for the whole
# flood's prompts (minutes).
TTFT_BOUND_S = 30.0
# Cancelled requests leave within 1 s; the gauge is refreshed every second.
DRAIN_BOUND_S = 4.0
EXIT_TIMEOUT_S = 30


def long_prompt(n: int) -> str:
    # Distinct from the first word, so llama.cpp cannot reuse one prompt's evaluation for another.
    words = ("applicant", "loan", "repaid", "savings", "house", "credit", "months", "bank")
    return f"Case {n}: " + " ".join(words[(n + i) % len(words)] for i in range(500))


@pytest.fixture(scope="module")
def llm_server(built_artifacts, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("llm_admission")
    repository = tmp_path / "model_repository_llm"
    shutil.copytree(LLM_REPOSITORY / "llm", repository / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / "llm" / "config.pbtxt"
    text = config.read_text()
    for key, value in (("max_queue_size", QUEUE_SIZE), ("slots", SLOTS)):
        text, count = re.subn(rf'(key: "{key}"\s*value: \{{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert count == 1, key
    config.write_text(text)
    server = triton_server([repository], log_path=tmp_path / "tritonserver.log",
                           exit_timeout_seconds=EXIT_TIMEOUT_S, stop_gracefully=True)
    with serving(server):
        yield server


def leaving_client(url: str, n: int) -> int | None:
    """Starts a long generation and leaves after CLIENT_PATIENCE_S; the HTTP status when one came before."""
    host, port = url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=CLIENT_PATIENCE_S)
    try:
        connection.request("POST", "/v2/models/llm/generate_stream",
                           json.dumps({"text_input": long_prompt(n), "max_tokens": 512}),
                           {"Content-Type": "application/json"})
        return connection.getresponse().status
    except (TimeoutError, OSError):
        return None
    finally:
        connection.close()


def llm_metrics(metrics_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://localhost:{metrics_port}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("s2t_llm_")}


def settled_metrics(metrics_port: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The metrics once nothing generates or waits and two reads agree: a request counts its outcome after its
    client has its last answer, so a read right after an earlier test's requests can miss the last of them."""
    deadline, previous = time.monotonic() + timeout_s, None
    while True:
        metrics = llm_metrics(metrics_port)
        idle = not any(v for k, v in metrics.items() if k.startswith(("s2t_llm_active_slots", "s2t_llm_queue_depth")))
        if (idle and metrics == previous) or time.monotonic() > deadline:
            return metrics
        previous = metrics
        time.sleep(0.25)


def outcome(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("s2t_llm_requests_total") and f'outcome="{name}"' in k)


def test_a_request_over_the_queue_bound_is_refused_at_once_naming_the_queue(llm_server):
    url = llm_server.http_url
    # Clients that stay fill the slots and the queue; those beyond are refused at once, the others are served.
    clients = SLOTS + QUEUE_SIZE + 8
    body = {"text_input": "Tell me about loans. " * 20, "max_tokens": 16}
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _: generate_stream(url, body, timeout=300), range(clients)))
    refused = [r for r in results if r.error is not None]
    served = [r for r in results if r.error is None]
    assert all(r.final["output_tokens"] == 16 for r in served)
    assert len(served) >= SLOTS and refused, "the requests beyond the queue bound are refused"
    # Busy, not a bad request: 429 on the HTTP port (the front maps Triton's 400); gRPC clients see UNAVAILABLE.
    assert all(r.status == 429 and "admission queue is full" in r.error and "retry" in r.error
               for r in refused), [(r.status, r.error) for r in refused]
    assert generate_stream(url, {"text_input": "Say hi.", "max_tokens": 2}).error is None


def test_a_grpc_stream_cancelled_while_queued_leaves_the_queue_within_a_second(llm_server):
    import numpy as np
    import tritonclient.grpc as grpcclient
    url = llm_server.http_url
    before = outcome(settled_metrics(llm_server.metrics_port), "cancelled")
    # Two long prompts ahead: evaluated one at a time (max_prefill_tokens), seconds of work the queued one waits for.
    with ThreadPoolExecutor(2) as pool:
        ahead = [pool.submit(generate_stream, url, {"text_input": long_prompt(100 + n), "max_tokens": 2}, "llm", 300)
                 for n in range(2)]
        time.sleep(0.3)
        client = grpcclient.InferenceServerClient(llm_server.grpc_url)
        answers = []
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        prompt = grpcclient.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"Say hi."], dtype=object))
        client.async_stream_infer("llm", [prompt])
        time.sleep(0.5)
        client.stop_stream(cancel_requests=True)
        cancelled_at = time.monotonic()
        while outcome(llm_metrics(llm_server.metrics_port), "cancelled") == before:
            assert time.monotonic() - cancelled_at < 3, "the cancelled request is still queued"
            time.sleep(0.1)
        left_after = time.monotonic() - cancelled_at
        client.close()
        assert all(f.result().error is None for f in ahead)
    assert left_after < 1.5 and not any(result is not None and result.as_numpy("text_output") is not None
                                        and result.as_numpy("text_output")[0] for result, _ in answers)


def test_clients_that_leave_free_the_queue_and_a_short_prompt_beside_them_is_served(llm_server):
    url = llm_server.http_url
    before = settled_metrics(llm_server.metrics_port)
    start = threading.Barrier(FLOOD + 1)

    def flood_client(n: int):
        start.wait(60)
        return leaving_client(url, n)

    with ThreadPoolExecutor(FLOOD) as pool:
        flood = [pool.submit(flood_client, n) for n in range(FLOOD)]
        start.wait(60)
        time.sleep(CLIENT_PATIENCE_S)
        first_try = time.monotonic()
        # A valid client does what the refusal says: it retries (a bounded number of times) while the queue is full.
        for retries in range(RETRIES):
            valid = generate_stream(url, {"text_input": "Say hi.", "max_tokens": 4}, timeout=120)
            if valid.error is None or "admission queue is full" not in valid.error:
                break
            time.sleep(0.5)
        statuses = [f.result() for f in flood]
    assert valid.error is None and valid.final["output_tokens"] == 4, valid.error
    first_token = valid.token_times()[0] - first_try
    assert first_token < TTFT_BOUND_S, f"first token {first_token:.1f} s after the first try"
    # Each flood client left (None) or was refused (429); one admitted at once can also see its stream begin (200):
    # the model probes a stream with no token yet FIRST_PROBE_AFTER_S (0.1 s, the clients' patience) after it came.
    assert not [status for status in statuses if status not in (None, 429, 200)], statuses

    # Every flood request is answered: refused at once (the queue holds QUEUE_SIZE) or cancelled; none is left
    # waiting, and the queue depth gauge is back to 0.
    deadline = time.monotonic() + DRAIN_BOUND_S
    while True:
        metrics = llm_metrics(llm_server.metrics_port)
        depth = metrics['s2t_llm_queue_depth{model="llm",version="1"}']
        settled = sum(outcome(metrics, o) - outcome(before, o) for o in ("refused", "cancelled")) - retries
        # The valid request's outcome is counted once its final response has gone, which its client may see first.
        completed = outcome(metrics, "completed") - outcome(before, "completed")
        if (depth == 0 and settled == FLOOD and completed == 1) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert depth == 0, f"{depth:.0f} requests still queued {DRAIN_BOUND_S} s after their clients left"
    assert settled == FLOOD, metrics
    assert completed == 1, metrics

    stopping = time.monotonic()
    assert llm_server.stop() == 0
    assert time.monotonic() - stopping < EXIT_TIMEOUT_S / 2
    log = llm_server.log_path.read_text(errors="replace")
    assert "Signal (11)" not in log and "Exit timeout expired" not in log, log[-3000:]

