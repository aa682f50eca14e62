"""One generation request answered as Triton's LLM backends answer it: each token as a partial response (or all of
them at the end when `stream` is false), then a final response with the whole text, the token counts and the finish
reason, or a final error. The engine calls back from its own thread; every send goes through the outbox, the only
thread that talks to Triton. `tensor` is pb_utils.Tensor (handed in: nothing here imports Triton)."""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from backends.decoupled_sender import Outbox, StreamSender
from backends.llm_engine import Completion, Job
from backends.llm_metrics import LlmMetrics, StreamTiming
from backends.llm_request import GenerationRequest


class GenerationStream:
    def __init__(self, generation: GenerationRequest, prompt_tokens: int, sender: StreamSender, outbox: Outbox,
                 metrics: LlmMetrics, client_cancelled: Callable[[], bool], tensor: Callable, internal_code,
                 clock: Callable[[], float] = time.monotonic):
        self.generation, self.prompt_tokens, self.sender, self.outbox = generation, prompt_tokens, sender, outbox
        self.metrics, self.client_cancelled, self.tensor, self.internal_code = (metrics, client_cancelled, tensor,
                                                                               internal_code)
        self.clock, self.timing, self.pieces = clock, StreamTiming(clock()), []
        # Read by the engine on every token; set from the outbox, which alone asks Triton about the client.
        self.cancelled = threading.Event()

    def job(self) -> Job:
        return Job(self.generation, self.prompt_tokens, self._on_token, self._on_finish, self.cancelled.is_set)

    def _on_token(self, text: str) -> None:
        now = self.clock()
        self.outbox.put(lambda: self._deliver_token(text, now))

    def _on_finish(self, completion: Completion) -> None:
        self.outbox.put(lambda: self._deliver_finish(completion))

    def _text(self, text: str):
        return self.tensor("text_output", np.array([text.encode()], dtype=object))

    def _deliver_token(self, text: str, now: float) -> None:
        if self.client_cancelled():
            self.cancelled.set()
        self.metrics.token(self.timing, now)
        if self.generation.stream:
            self.sender.send([self._text(text)])
        else:
            self.pieces.append(text)

    def _deliver_finish(self, completion: Completion) -> None:
        if completion.error is not None:
            self.sender.fail(f"llm: {completion.error}", self.internal_code)
            self.metrics.request("failed")
            return
        self.sender.finish([
            self._text("".join(self.pieces)),
            self.tensor("input_tokens", np.array([completion.prompt_tokens], dtype=np.int32)),
            self.tensor("output_tokens", np.array([completion.completion_tokens], dtype=np.int32)),
            self.tensor("finish_reason", np.array([completion.finish_reason.encode()], dtype=object)),
        ])
        self.metrics.request("cancelled" if completion.finish_reason == "cancelled" else "completed")
