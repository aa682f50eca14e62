"""Is a GGUF file fit to serve as `llm`? It loads in llama.cpp, its chat template renders a user turn, and it
generates a few tokens through that template (what `llm` does with every request).

The check runs in a child process with a time limit: llama.cpp aborts the whole process on some malformed files
and may hang on others, and neither may take the publishing command (or its lock) with it.
`python -m s2t.control.llm_check FILE.gguf` prints one JSON line: the figures, or `{"error": ...}` with exit 1.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

GGUF_MAGIC = b"GGUF"
CHECK_TIMEOUT_S = 180.0
CHECK_TOKENS = 4
MARKER = "Reply with one word: ready?"


class GgufRefused(Exception):
    """The file cannot serve as the language model; the message says which check failed."""


def check_gguf(path: Path, timeout_s: float = CHECK_TIMEOUT_S) -> dict:
    """The figures of a passed check, or GgufRefused (a child that failed, crashed or ran over `timeout_s`)."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise GgufRefused(f"{path}: not a GGUF file (it does not start with {GGUF_MAGIC.decode()})")
    try:
        done = subprocess.run([sys.executable, "-m", "s2t.control.llm_check", str(path.resolve())],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise GgufRefused(f"{path}: the check (load, chat template, {CHECK_TOKENS} tokens) did not finish within "
                          f"{timeout_s:.0f} s") from None
    result = _last_json(done.stdout)
    if done.returncode == 0 and result is not None and "error" not in result:
        return result
    if result is not None and "error" in result:
        raise GgufRefused(f"{path}: {result['error']}")
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise GgufRefused(f"{path}: llama.cpp failed on it (exit {done.returncode}: {tail})")


def _last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _post(address: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(address + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def run_check(path: Path) -> dict:
    """In this process: load, render the template, generate; the figures, or a dict with `error`."""
    import xllamacpp

    started = time.monotonic()
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_parallel = 1
    params.n_ctx = 512
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.verbosity = -1
    try:
        server = xllamacpp.Server(params)
    except Exception as err:  # noqa: BLE001 - any load failure refuses the file, with llama.cpp's reason
        return {"error": f"llama.cpp cannot load it ({err})"}
    load_s = time.monotonic() - started
    messages = [{"role": "user", "content": MARKER}]
    try:
        rendered = _post(server.listening_address, "/apply-template", {"messages": messages}).get("prompt", "")
    except Exception as err:  # noqa: BLE001 - the template is broken or missing: the reason goes to the operator
        return {"error": f"its chat template does not render ({err})"}
    if MARKER not in rendered or rendered.strip() == MARKER:
        return {"error": "its chat template does not wrap a user turn (the rendered prompt is the bare text)"}
    tokens = []

    def on_chunk(chunk) -> bool:
        for choice in chunk.get("choices", ()):
            text = (choice.get("delta") or {}).get("content")
            if text:
                tokens.append(text)
        return False

    result = server.handle_chat_completions({"messages": messages, "max_tokens": CHECK_TOKENS, "temperature": 0,
                                             "stream": True}, on_chunk)
    if isinstance(result, dict) and "error" in result:
        return {"error": f"generation failed ({result['error'].get('message')})"}
    if not tokens:
        return {"error": f"it generated no token for a {CHECK_TOKENS}-token request"}
    return {"load_s": round(load_s, 3), "template_chars": len(rendered), "tokens": len(tokens),
            "text": "".join(tokens)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(json.dumps({"error": "usage: python -m s2t.control.llm_check FILE.gguf"}))
        return 2
    result = run_check(Path(argv[0]))
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
