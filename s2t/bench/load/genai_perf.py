"""genai-perf against `llm`, unchanged, in both of Triton's LLM conventions (`--backend tensorrtllm` and `vllm`,
kserve endpoint, gRPC streaming): time to first token, inter-token latency and output tokens/s.

genai-perf lives in its own environment (`make genai-venv` builds .venv-genai: its transformers, pandas and
plotting stack stay out of the serving environment). The tokenizer it counts tokens with is written from the
served GGUF file's own metadata (s2t/bench/load/gguf_tokenizer.py, run in that environment): no network, no Hugging Face
download.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from s2t.errors import S2TError

ROOT = Path(__file__).resolve().parents[3]
GENAI_VENV = ROOT / ".venv-genai"
BACKENDS = ("tensorrtllm", "vllm")


class GenaiPerfError(S2TError, RuntimeError):
    pass


@dataclass(frozen=True)
class ProfilePoint:
    backend: str
    concurrency: int
    input_tokens: int
    output_tokens: int
    requests: int


def available(venv: Path = GENAI_VENV) -> bool:
    return (venv / "bin" / "genai-perf").is_file()


def environment(venv: Path) -> dict[str, str]:
    """perf_analyzer (tritonclient's binary in that environment) needs the CUDA runtime library even on a CPU."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    libs = sorted(venv.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(str(p) for p in (*libs, env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join((str(venv / "bin"), env.get("PATH", "")))
    return env


def write_tokenizer(gguf: Path, out_dir: Path, venv: Path = GENAI_VENV) -> Path:
    """The GGUF file's tokenizer as a Hugging Face folder, written once per GGUF file (its name and size key it)."""
    folder = out_dir / f"{gguf.stem}-{gguf.stat().st_size}"
    if (folder / "tokenizer.json").is_file():
        return folder
    done = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "s2t" / "bench" / "load" / "gguf_tokenizer.py"),
                           str(gguf), str(folder)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise GenaiPerfError(f"the tokenizer could not be written from {gguf}: {done.stderr.strip()[-2000:]}")
    return folder


def command(point: ProfilePoint, grpc_url: str, tokenizer: Path, artifacts: Path, venv: Path = GENAI_VENV,
            model: str = "llm") -> list[str]:
    return [str(venv / "bin" / "genai-perf"), "profile", "-m", model, "--endpoint-type", "kserve",
            "--backend", point.backend, "--streaming", "-u", grpc_url, "--tokenizer", str(tokenizer),
            "--synthetic-input-tokens-mean", str(point.input_tokens), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(point.output_tokens), "--output-tokens-mean-deterministic",
            "--concurrency", str(point.concurrency), "--request-count", str(point.requests),
            # No warm-up requests: the server measured is already warm, and perf_analyzer 2.51 was seen to hang
            # in its warm-up phase with a request count.
            "--num-prompts", str(max(point.requests, 4)), "--warmup-request-count", "0",
            "--artifact-dir", str(artifacts)]


def summary(export: dict) -> dict:
    """The figures kept from genai-perf's profile_export_genai_perf.json (milliseconds, tokens/s)."""
    def stat(name, key):
        value = export.get(name, {}).get(key)
        return None if value is None else float(value)
    return {"ttft_p50_ms": stat("time_to_first_token", "p50"), "ttft_p95_ms": stat("time_to_first_token", "p95"),
            "itl_p50_ms": stat("inter_token_latency", "p50"), "itl_p95_ms": stat("inter_token_latency", "p95"),
            "output_tokens_per_s": stat("output_token_throughput", "avg"),
            "requests_per_s": stat("request_throughput", "avg"),
            "output_sequence_length": stat("output_sequence_length", "avg"),
            "input_sequence_length": stat("input_sequence_length", "avg"),
            "requests": stat("request_count", "avg")}


def profile(point: ProfilePoint, grpc_url: str, tokenizer: Path, artifacts: Path, venv: Path = GENAI_VENV,
            timeout_s: float = 600) -> dict:
    """One genai-perf run; its summary with the point's settings, or GenaiPerfError with genai-perf's own words."""
    artifacts.mkdir(parents=True, exist_ok=True)
    # Its own process group: on a timeout perf_analyzer, genai-perf's child, is stopped with it.
    process = subprocess.Popen(command(point, grpc_url, tokenizer, artifacts, venv), cwd=artifacts,
                               env=environment(venv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise GenaiPerfError(f"genai-perf --backend {point.backend} did not finish within {timeout_s:.0f} s") from None
    done = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    exports = sorted(artifacts.glob("**/profile_export_genai_perf.json"))
    if done.returncode != 0 or not exports:
        raise GenaiPerfError(f"genai-perf --backend {point.backend} failed ({done.returncode}):\n"
                             f"{(done.stdout + done.stderr)[-3000:]}")
    return {"backend": point.backend, "concurrency": point.concurrency, "input_tokens": point.input_tokens,
            "max_tokens": point.output_tokens, **summary(json.loads(exports[-1].read_text()))}
