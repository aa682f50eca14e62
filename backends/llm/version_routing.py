"""Which version of the language model generates a request, and how its stream is relayed: llm_router's logic.

The split is risk_router's (backends/routing/routing_policy.py): the same parameters (`primary`, `candidate`,
`canary_percent`), rewritten by the same `s2t canary` / `promote` / `rollback`, and the same sticky hash. A
request's key is its request id when the client gave one (a retry lands on the same version), else the router's
own request count, so the share holds over any run of requests without ids.

A stream is relayed whole from the one version it started on: every response of that version is passed on, the
final one (the response carrying `finish_reason`) closes the client's stream, and nothing is ever switched
mid-stream. Nothing here imports Triton.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import numpy as np

from s2t.backends.runtime.serving_errors import ServingError, Unavailable
from s2t.backends.runtime.model_parameters import parameter, settings_of
from s2t.backends.routing.routing_policy import RoutingSettings, Target, route
from s2t.wire.names import SERVED_BY

# The response of the language model that ends a generation carries this output (llm's final response).
FINAL_OUTPUT = "finish_reason"


@dataclass(frozen=True)
class LlmRouterSettings:
    routing: RoutingSettings = settings_of(RoutingSettings)
    # Streams relayed at once; the next is refused at once (UNAVAILABLE) instead of queueing without bound. The
    # language model's slots plus its admission queue: more could only wait there or be refused by it.
    max_streams: int = parameter("max_streams", 72)

    def __post_init__(self):
        if self.routing.shadow_percent:
            raise ValueError("shadow_percent: a mirrored generation costs a whole generation; use canary_percent")
        if self.routing.fallback is not None:
            raise ValueError("fallback: the language model has no fallback model")
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {self.max_streams}")


class StreamRefused(Unavailable):
    """Every relay slot is taken: the request is refused at once, the caller may retry."""


class Splitter:
    """Picks the target of each new generation. Thread-safe: the request count is the only state."""

    def __init__(self, routing: RoutingSettings):
        self.routing = routing
        self._count = itertools.count()
        self._lock = threading.Lock()

    def key(self, request_id: str | None) -> str:
        if request_id:
            return f"id:{request_id}"
        with self._lock:
            return f"n:{next(self._count)}"

    def target(self, request_id: str | None, ready: Callable[[Target], bool]) -> Target:
        """The split's choice for this request, or the primary when the chosen candidate is not loaded (a
        config in transit: the router may run a split whose candidate a later step has unloaded), or the
        model's newest loaded version when the primary is not either."""
        chosen = route(self.routing, self.key(request_id)).target
        for target in (chosen, self.routing.primary):
            if ready(target):
                return target
        return Target(self.routing.primary.model)


class RelaySlots:
    """At most `limit` streams relayed at once; `take` refuses the next at once."""

    def __init__(self, limit: int):
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def take(self) -> None:
        with self._lock:
            if self._held >= self.limit:
                raise StreamRefused(f"llm_router: {self.limit} streams are running; retry")
            self._held += 1

    def release(self) -> None:
        with self._lock:
            self._held -= 1


def relay(responses: Iterable[Mapping[str, np.ndarray]], served_by: str, send: Callable[[dict], None],
          finish: Callable[[dict | None], None], fail: Callable[[ServingError], None],
          cancelled: Callable[[], bool]) -> str:
    """Pass one generation's responses on, each tagged with `served_by`; returns the outcome (`done`, `cancelled`,
    `failed`). A response carrying FINAL_OUTPUT is sent as the final one; a stream that ends without one is closed
    by an empty final response. A caller that cancelled gets its final response at once; the rest of the stream is
    read and dropped (the call cannot be cancelled from here, and is bounded by its max_tokens). A ServingError
    raised by `responses` (the model refused the request, or failed mid-stream) is that caller's error."""
    tag = np.array([served_by.encode()], dtype=object)
    outcome, open_ = "done", True
    try:
        for outputs in responses:
            if not open_:
                continue
            if cancelled():
                finish(None)
                outcome, open_ = "cancelled", False
                continue
            tagged = {**outputs, SERVED_BY: tag}
            if FINAL_OUTPUT in outputs:
                finish(tagged)
                open_ = False
            else:
                send(tagged)
    except ServingError as err:
        if open_:
            fail(err)
            open_ = False
        outcome = "failed"
    if open_:
        finish(None)
    return outcome
