"""`llm` on the real server: token streaming, the final counts, bad input under concurrency, metrics."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from s2t.clients.llm_client import generate_stream
from tests.conftest import ROOT, free_port


PROMPT = "What is credit risk? Answer in one sentence."


def test_generate_stream_sends_tokens_as_they_come_and_ends_with_the_counts(triton_llm):
    result = generate_stream(triton_llm.http_url, {"text_input": PROMPT, "max_tokens": 8})
    assert result.error is None
    # Events with empty text are the probes a request gets while it waits for its first token. A token is sent as
    # it comes; tokens that come while the previous one is still being sent go out together in the next response.
    tokens = [e for _, e in result.events[:-1] if e["text_output"]]
    assert 1 <= len(tokens) <= 8 and "".join(e["text_output"] for e in tokens) == result.text
    assert result.final["output_tokens"] == 8 and result.final["finish_reason"] == "length"
    assert result.final["input_tokens"] > 5
    assert result.ttft is not None and result.ttft < 30


def test_a_single_response_carries_the_same_text_as_the_stream(triton_llm):
    body = json.dumps({"text_input": PROMPT, "max_tokens": 8, "stream": False}).encode()
    request = urllib.request.Request(f"http://{triton_llm.http_url}/v2/models/llm/generate", data=body)
    with urllib.request.urlopen(request, timeout=60) as response:
        whole = json.loads(response.read())
    streamed = generate_stream(triton_llm.http_url, {"text_input": PROMPT, "max_tokens": 8})
    # temperature 0 (the default) is greedy decoding: the same prompt gives the same text.
    assert whole["text_output"] == streamed.text != ""
    assert whole["output_tokens"] == 8


BAD = [
    ({"text_input": "", "max_tokens": 4}, "text_input: empty prompt"),
    ({"text_input": "   ", "max_tokens": 4}, "text_input: empty prompt"),
    ({"text_input": "credit " * 1500, "max_tokens": 4}, "over the limit of 1024"),
    ({"text_input": PROMPT, "max_tokens": 0}, "max_tokens: must be between 1 and 512"),
    ({"text_input": PROMPT, "max_tokens": 100000}, "max_tokens: must be between 1 and 512"),
    ({"text_input": PROMPT, "max_tokens": 4, "top_p": 3.0}, "top_p: must be between"),
    ({"text_input": PROMPT, "max_tokens": 4, "beam_width": 2}, "beam_width: must be between 1 and 1"),
    ({"text_input": PROMPT, "return_log_probs": True}, "return_log_probs: not supported by this engine"),
    ({"text_input": PROMPT, "sampling_parameters": '{"best_of": 2}'}, "sampling_parameters.best_of: unknown"),
    ({"text_input": PROMPT, "sampling_parameters": '{"max_tokens": 9999}'}, "sampling_parameters.max_tokens: must"),
    ({"text_input": PROMPT, "seed": 1, "random_seed": 2}, "random_seed: also given as seed"),
]


def test_bad_requests_get_their_own_error_while_concurrent_good_ones_complete(triton_llm):
    good = [{"text_input": f"Name {n} colours.", "max_tokens": 4} for n in range(4)]
    with ThreadPoolExecutor(len(BAD) + len(good)) as pool:
        bad_results = [pool.submit(generate_stream, triton_llm.http_url, body) for body, _ in BAD]
        good_results = [pool.submit(generate_stream, triton_llm.http_url, body) for body in good]
        bad_results = [f.result() for f in bad_results]
        good_results = [f.result() for f in good_results]
    for (body, message), result in zip(BAD, bad_results):
        assert result.error is not None and message in result.error, (body, result.error)
        assert result.status == 400
    for result in good_results:
        assert result.error is None and result.final["output_tokens"] == 4
    assert generate_stream(triton_llm.http_url, {"text_input": PROMPT, "max_tokens": 2}).error is None


def test_tensorrt_llm_and_vllm_inputs_steer_the_generation(triton_llm):
    url = triton_llm.http_url
    plain = generate_stream(url, {"text_input": PROMPT, "max_tokens": 16})
    words = plain.text.split()
    assert plain.error is None and len(words) > 5
    # Stop words (empty strings are "none", as genai-perf sends them): the text ends before the word.
    stopped = generate_stream(url, {"text_input": PROMPT, "max_tokens": 16, "stop_words": [words[4], ""]})
    assert stopped.final["finish_reason"] == "stop" and stopped.final["output_tokens"] < 16
    assert plain.text.startswith(stopped.text) and words[4] not in stopped.text.split()
    # Banned words are never generated.
    banned = generate_stream(url, {"text_input": PROMPT, "max_tokens": 16, "bad_words": [words[1]]})
    assert banned.error is None and not re.search(rf"\b{re.escape(words[1])}\b", banned.text), banned.text
    # vLLM's sampling_parameters, with a seed: sampling at temperature 1 gives the same text twice.
    sampling = json.dumps({"max_tokens": 5, "temperature": 1.0, "seed": 11})
    seeded = [generate_stream(url, {"text_input": PROMPT, "sampling_parameters": sampling,
                                    "exclude_input_in_output": True}) for _ in range(2)]
    assert [r.final["output_tokens"] for r in seeded] == [5, 5] and seeded[0].text == seeded[1].text
    # exclude_input_in_output false: the single answer starts with the prompt.
    whole = generate_stream(url, {"text_input": PROMPT, "max_tokens": 4, "stream": False,
                                  "exclude_input_in_output": False, "random_seed": 5, "runtime_top_k": 1})
    assert whole.text.startswith(PROMPT) and len(whole.text) > len(PROMPT)


def test_four_concurrent_prompts_of_very_different_lengths_all_complete(triton_llm):
    prompts = ["Hi.", "Summarise: " + "the applicant repaid every loan on time. " * 8,
               "Summarise: " + "the applicant has a savings account and owns a house. " * 30, "Why?"]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: generate_stream(triton_llm.http_url, {"text_input": p, "max_tokens": 6}),
                                prompts))
    assert [r.error for r in results] == [None] * 4
    assert all(r.final["output_tokens"] == 6 for r in results)
    lengths = [r.final["input_tokens"] for r in results]
    assert max(lengths) > 10 * min(lengths)


def test_the_metrics_port_shows_tokens_per_second_ttft_and_queue_depth(triton_llm):
    generate_stream(triton_llm.http_url, {"text_input": PROMPT, "max_tokens": 4})
    with urllib.request.urlopen(f"http://localhost:{triton_llm.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("s2t_llm_") and " " in line}
    assert lines['s2t_llm_tokens_total{model="llm",version="1"}'] >= 4
    assert 's2t_llm_tokens_per_second{model="llm",version="1"}' in lines
    assert 's2t_llm_queue_depth{model="llm",version="1"}' in lines
    assert 's2t_llm_active_slots{model="llm",version="1"}' in lines
    assert lines['s2t_llm_time_to_first_token_seconds_count{model="llm",version="1"}'] >= 1
    assert lines['s2t_llm_inter_token_latency_seconds_count{model="llm",version="1"}'] >= 3


def test_a_client_that_disconnects_stops_its_generation(triton_llm):
    connection = http.client.HTTPConnection("localhost", triton_llm.http_port, timeout=60)
    connection.request("POST", "/v2/models/llm/generate_stream",
                       json.dumps({"text_input": "Write a long story about a bank.", "max_tokens": 400}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.readline().startswith(b"data:")
    connection.close()

    def cancelled() -> float:
        with urllib.request.urlopen(f"http://localhost:{triton_llm.metrics_port}/metrics", timeout=10) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith("s2t_llm_requests_total") and 'outcome="cancelled"' in line)
    deadline = time.monotonic() + 30
    while cancelled() < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cancelled() >= 1


def test_s2t_serve_llm_serves_the_language_model_beside_the_risk_models(built_artifacts, tmp_path):
    http_port = free_port()
    openai_port = free_port()
    env = {**os.environ, "HTTP_PORT": str(http_port), "GRPC_PORT": str(free_port()),
           "METRICS_PORT": str(free_port()), "SUPERVISOR_PORT": str(free_port()), "OPENAI_PORT": str(openai_port)}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(Path(sys.executable).parent / "s2t"), "serve", "--llm", "--exit-timeout", "5"],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "ready:" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        url = f"localhost:{http_port}"
        result = generate_stream(url, {"text_input": PROMPT, "max_tokens": 4})
        assert result.error is None and result.final["output_tokens"] == 4
        with urllib.request.urlopen(f"http://{url}/v2/models/risk_explainer/ready", timeout=10) as response:
            assert response.status == 200
        with urllib.request.urlopen(f"http://{url}/v2/models/risk_pipeline/ready", timeout=10) as response:
            assert response.status == 200
        # The OpenAI-compatible API on its own port, in front of the same llm.
        with urllib.request.urlopen(f"http://localhost:{openai_port}/v1/models", timeout=10) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == ["llm"]
        chat = urllib.request.Request(f"http://localhost:{openai_port}/v1/chat/completions", data=json.dumps(
            {"model": "llm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(chat, timeout=120) as response:
            assert json.loads(response.read())["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def test_s2t_serve_llm_refuses_to_start_when_the_openai_port_is_taken(built_artifacts, tmp_path):
    """The OpenAI API starts before `ready:`: a port it cannot take fails the start (non-zero, never ready), and what
    had started (tritonserver, its ports) is stopped."""
    http_port = free_port()
    env = {**os.environ, "HTTP_PORT": str(http_port), "GRPC_PORT": str(free_port()),
           "METRICS_PORT": str(free_port()), "SUPERVISOR_PORT": str(free_port())}
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        env["OPENAI_PORT"] = str(taken.getsockname()[1])
        log = tmp_path / "serve.log"
        with open(log, "wb") as out:
            process = subprocess.Popen([str(Path(sys.executable).parent / "s2t"), "serve", "--llm",
                                        "--exit-timeout", "5"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = process.wait(300)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(30)
    text = log.read_text()
    assert code != 0 and "ready:" not in text, text[-3000:]
    assert "the OpenAI API could not start" in text
    with socket.socket() as probe:  # nothing listens on tritonserver's HTTP port any more: the server was stopped
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its closed connections may linger (TIME_WAIT)
        probe.bind(("0.0.0.0", http_port))
