"""One generation request answered as Triton's LLM backends answer it: each token as a partial response (or all of
them at the end when `stream` is false), then a final response with the whole text, the token counts and the finish
reason, or a final error. The engine calls back from its own thread; every send goes through the outbox, which lets
one task at a time talk to Triton. `tensor` is pb_utils.Tensor (handed in: nothing here imports Triton)."""
from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np

from s2t.backends.runtime.decoupled_sender import Outbox, StreamSender
from s2t.backends.runtime.serving_errors import InternalError
from s2t.backends.llm.engine import Completion, Job
from s2t.backends.llm.stream_timing import LlmMetrics, PendingTokens, StreamTiming
from s2t.backends.llm.generation_request import GenerationRequest


class LiveStreams:
    """The streams not answered yet. A request waiting for a slot, or whose prompt is being evaluated, sends
    nothing, so nothing would notice that its client has gone: `tick` (run by the outbox, the one thread that talks
    to Triton, every TICK_S) checks each every CANCEL_POLL_S, and those still waiting for their first token in their
    first YOUNG_S every tick: a flood of clients that leave at once leaves the queue about when they do, and the
    queue's places stay free for the clients that stay. `on_cancel` (the engine's wake-up) is called when a check
    finds clients gone, so their requests leave the queue at once. Bounded by the engine's queue and slots."""

    def __init__(self, on_cancel: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self._lock = threading.Lock()
        self._streams: set[GenerationStream] = set()
        self._on_cancel = on_cancel
        self._clock = clock
        self._last_sweep = clock()

    def __len__(self) -> int:
        return len(self._streams)

    def add(self, stream: "GenerationStream") -> None:
        with self._lock:
            self._streams.add(stream)

    def discard(self, stream: "GenerationStream") -> None:
        with self._lock:
            self._streams.discard(stream)

    def submit(self, stream: "GenerationStream", submit: Callable[[Job], None]) -> None:
        """`stream` kept live and its job handed to `submit` (the engine): added first, since the engine may finish
        it at once; a stream whose job was refused is not kept."""
        self.add(stream)
        try:
            submit(stream.job())
        except Exception:
            self.discard(stream)
            raise

    def sweep(self) -> None:
        """Every live stream checked."""
        self._check(lambda stream: True)

    def tick(self) -> None:
        now = self._clock()
        if now - self._last_sweep >= CANCEL_POLL_S:
            self._last_sweep = now
            self.sweep()
        else:
            self._check(lambda stream: stream.timing.first_token is None and now - stream.timing.started < YOUNG_S)

    def run_ticks(self, put: Callable[[Callable[[], None]], None], stopping: threading.Event,
                  every_s: float | None = None) -> None:
        """Hands `tick` to `put` (the outbox's) every `every_s` (TICK_S) until `stopping` is set, one at a time: an
        outbox that falls behind is not handed a pile of them."""
        ticked = threading.Event()
        ticked.set()

        def tick():
            try:
                self.tick()
            finally:
                ticked.set()

        while not stopping.wait(every_s or TICK_S):
            if ticked.is_set():
                ticked.clear()
                put(tick)

    def _check(self, which: Callable[["GenerationStream"], bool]) -> None:
        with self._lock:
            streams = [stream for stream in self._streams if not stream.cancelled.is_set() and which(stream)]
        for stream in streams:
            stream.check_client()
        if self._on_cancel is not None and any(stream.cancelled.is_set() for stream in streams):
            self._on_cancel()


# Seconds between two checks of every live stream.
CANCEL_POLL_S = 0.25
# Seconds between two checks of the streams that came less than YOUNG_S ago and have had no token yet.
TICK_S = 0.05
YOUNG_S = 1.0
# A stream without a token this long after it came is probed (an empty text_output): Triton 2.51's HTTP endpoint
# reads nothing from a generate_stream connection until the request's first response, so only from then on does it
# see a client that has gone (at once: the HTTP front closes its connection to Triton the moment its client
# leaves). A short request has its first token before this and is never probed.
FIRST_PROBE_AFTER_S = 0.1
# Then again every this long while no token comes (for whatever sits between Triton and the client).
PROBE_AFTER_S = 0.5
# While tokens flow, the client is asked about at most this often: each ask is a round trip to the server process
# (about 0.1 ms of the outbox's time per token, the one thread that sends every stream's tokens), and a token comes
# every ~12 ms. A client that leaves is still seen within this, well inside the sweep's own interval.
CLIENT_CHECK_S = 0.05
# A stream's token count and inter-token gaps go to Triton's metrics in batches of this many tokens (and at its end).
METRICS_BATCH_TOKENS = 32


class GenerationStream:
    def __init__(self, generation: GenerationRequest, prompt_tokens: int, sender: StreamSender, outbox: Outbox,
                 metrics: LlmMetrics, client_cancelled: Callable[[], bool], tensor: Callable,
                 clock: Callable[[], float] = time.monotonic, live: LiveStreams | None = None):
        self.generation, self.prompt_tokens, self.sender, self.outbox = generation, prompt_tokens, sender, outbox
        self.metrics, self.client_cancelled, self.tensor = metrics, client_cancelled, tensor
        self.clock, self.timing, self.pieces = clock, StreamTiming(clock()), []
        # Read by the engine on every token and while queued; set from the outbox, which alone asks Triton about
        # the client.
        self.cancelled = threading.Event()
        self.live = live
        self.last_probe: float | None = None
        self.last_client_check: float | None = None
        self.pending_metrics = PendingTokens()
        # Tokens generated and not yet sent, with their times: when the outbox falls behind the engine, the tokens
        # that piled up go in one response (one round trip to the server, one event to the client) rather than one
        # each.
        self._unsent: list[tuple[str, float]] = []
        self._unsent_lock = threading.Lock()

    def check_client(self) -> None:
        """Marks the stream cancelled when its client has gone. Triton 2.51 reports a
        gRPC client's cancellation at once, but an HTTP (generate_stream) client's disconnection only once the
        request has had a response: a stream still waiting for its first token is sent an empty text_output as a
        probe (clients skip empty text, as they do with Triton's LLM backends)."""
        if self.cancelled.is_set():
            return
        if self.client_cancelled():
            self.cancelled.set()
            return
        now = self.clock()
        due = self.timing.started + FIRST_PROBE_AFTER_S if self.last_probe is None else \
            self.last_probe + PROBE_AFTER_S
        if self.generation.stream and self.timing.first_token is None and now >= due:
            self.last_probe = now
            self.sender.send([self._text("")])

    def job(self) -> Job:
        return Job(self.generation, self.prompt_tokens, self._on_token, self._on_finish, self.cancelled.is_set)

    def _on_token(self, text: str) -> None:
        now = self.clock()
        with self._unsent_lock:
            self._unsent.append((text, now))
            if len(self._unsent) > 1:
                return  # a delivery is already queued on the outbox and takes this token too
        # Sent from the engine's thread when the outbox is idle (one stream at a time is the usual case), else
        # queued behind what the outbox is doing.
        self.outbox.run_or_put(self._deliver_tokens)

    def _on_finish(self, completion: Completion) -> None:
        self.outbox.run_or_put(lambda: self._deliver_finish(completion))

    def _text(self, text: str):
        return self.tensor("text_output", np.array([text.encode()], dtype=object))

    def _deliver_tokens(self) -> None:
        with self._unsent_lock:
            tokens, self._unsent = self._unsent, []
        if not tokens:
            return
        text = tokens[0][0] if len(tokens) == 1 else "".join(t for t, _ in tokens)
        # The tokens go out first: the metric updates and the client check are round trips to the server process
        # that the client need not wait for.
        if self.generation.stream:
            self.sender.send([self._text(text)])
        else:
            self.pieces.append(text)
        for _, at in tokens:
            self.metrics.token(self.timing, at, self.pending_metrics)
        if self.pending_metrics.tokens >= METRICS_BATCH_TOKENS:
            self.metrics.flush(self.pending_metrics)
        checked_at = self.clock()
        if self.last_client_check is None or checked_at - self.last_client_check >= CLIENT_CHECK_S:
            self.last_client_check = checked_at
            if self.client_cancelled():
                self.cancelled.set()

    def _deliver_finish(self, completion: Completion) -> None:
        if self.live is not None:
            self.live.discard(self)
        # Tokens still unsent (a delivery is queued before this, but a failed one leaves none behind) and the
        # metrics kept for this stream go before its final response, so whoever reads them after it sees them.
        self._deliver_tokens()
        self.metrics.flush(self.pending_metrics)
        if completion.error is not None:
            self.sender.refuse(InternalError(f"llm: {completion.error}"))
            self.metrics.request("failed")
            return
        text = "".join(self.pieces)
        if self.generation.include_input and not self.generation.stream:
            text = self.generation.prompt + text
        self.sender.finish([
            self._text(text),
            self.tensor("input_tokens", np.array([completion.prompt_tokens], dtype=np.int32)),
            self.tensor("output_tokens", np.array([completion.completion_tokens], dtype=np.int32)),
            self.tensor("finish_reason", np.array([completion.finish_reason.encode()], dtype=object)),
        ])
        self.metrics.request("cancelled" if completion.finish_reason == "cancelled" else "completed")
