"""Admission of queued generation requests into the engine's slots, grouped by prompt length.

The engine (llama.cpp's server) evaluates the prompts of every slot admitted together in one batch, so a short
prompt admitted beside a long one gets its first token only once the long prompt has been evaluated. Length-aware
admission keeps such requests apart: a group never holds prompts whose token counts differ by more than
`max_length_ratio` and holds at most `max_group_size` requests; one group's prompts are evaluated at a time.

Admission is work-conserving: whenever no prompt is being evaluated, the waiting group with the shortest prompts
goes as soon as some group is full or holds a request that has waited its hold: `hold_fraction` of what evaluating its
prompt is expected to take (at most `max_queue_delay_ms`). The expected cost per prompt token is a moving estimate
from llama.cpp's own timings of the prompts it has evaluated (`PromptEvaluationRate`), so the hold follows the
machine: when evaluation slows down under load, the hold grows with it and short prompts arriving just after a long
one still go first; until a prompt has been measured, `hold_per_prompt_token_ms` is the hold per token. A lone short
prompt is admitted at once; a long one waits a little for shorter prompts that may come just after it, which would
otherwise wait out its whole evaluation. Ordering by length applies only among the requests actually waiting. A group that has
waited ten delays goes first, so long prompts are delayed, never starved.

Which requests get the free slots is decided apart from the order their prompts are evaluated in. llama.cpp starts
evaluating a prompt as soon as it is handed the request, so a slot cannot be taken without its evaluation; but a
slot can be kept for a request whose evaluation comes after a shorter group's. When more requests wait than slots
are free, some must wait for a running generation to end (seconds of tokens), then pay their own evaluation: the
tail of the time to first token is least when those left waiting are the cheapest to evaluate. So the free slots go
to the longest length classes first (oldest first within a class; `slot_choice`), and those requests' prompts are
evaluated shortest group first; the others, the shortest prompts, wait for the next slot freed. The price is the
median first token: fewer requests get theirs at once (`slot_choice` shortest_first gives the slots to the shortest
prompts instead). A request that has waited ten delays comes before every other, oldest first, so short prompts too
are delayed, never starved. With slots for all, no request is chosen out: only the order of evaluation applies.

A group no longer than the length class of the prompts being evaluated joins them at once, within
`max_prefill_tokens` in all: llama.cpp evaluates them in the same steps, so a short request given a slot freed by a
running generation does not wait out another short prompt's first token.

`fifo` admission, the baseline, takes the oldest requests whatever their lengths.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from s2t.backends.runtime.model_parameters import parameter

LENGTH_AWARE = "length_aware"
FIFO = "fifo"
POLICIES = (LENGTH_AWARE, FIFO)
# Length-aware admission with more requests waiting than slots free: which length classes get the free slots.
LONGEST_FIRST = "longest_first"
SHORTEST_FIRST = "shortest_first"
SLOT_CHOICES = (LONGEST_FIRST, SHORTEST_FIRST)
# A group waiting this many queue delays goes before shorter ones: long prompts are delayed, never starved.
STARVATION_DELAYS = 10


class BatchingSettingsError(ValueError):
    pass


@dataclass(frozen=True)
class BatchingSettings:
    policy: str = parameter("batching_policy", LENGTH_AWARE)
    max_length_ratio: float = parameter("max_length_ratio", 3.0)
    max_group_size: int = parameter("max_group_size", 32)
    # The longest a request waits for batch-mates while no prompt is being evaluated, and the unit of starvation.
    max_queue_delay_ms: float = parameter("max_queue_delay_ms", 200.0)
    # A waiting request's hold per prompt token until a prompt evaluation has been measured: about a tenth of what
    # one llama.cpp thread takes to evaluate a token on an idle core (~1.5 ms).
    hold_per_prompt_token_ms: float = parameter("hold_per_prompt_token_ms", 0.15)
    # Requests waiting for a slot; one more is refused at once, so a flood cannot hold everyone else for minutes.
    max_queue_size: int = parameter("max_queue_size", 64)
    # Prompt tokens admitted for evaluation at once (one prompt at least): the engine cannot stop a prompt's
    # evaluation, so this bounds how long a new request waits behind prompts already admitted.
    max_prefill_tokens: int = parameter("max_prefill_tokens", 1024)
    # A waiting request's hold as a share of its prompt's expected evaluation: a long prompt pays at most this
    # share of its own evaluation for the chance that a shorter one arrives just after it and goes first.
    hold_fraction: float = parameter("hold_fraction", 0.1)
    # Which waiting requests get the free slots when not all of them fit (length-aware admission): the longest
    # length classes, so that those left waiting for a running generation to end are the cheapest to evaluate
    # (the slowest first tokens are lower), or the shortest, so that more requests get their first token at once
    # (the median first token is lower). Either way the prompts admitted are evaluated shortest group first.
    slot_choice: str = parameter("slot_choice", LONGEST_FIRST)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise BatchingSettingsError(f"batching_policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.slot_choice not in SLOT_CHOICES:
            raise BatchingSettingsError(f"slot_choice must be one of {', '.join(SLOT_CHOICES)}, "
                                        f"got {self.slot_choice!r}")
        if not self.max_length_ratio >= 1.0:
            raise BatchingSettingsError(f"max_length_ratio must be at least 1, got {self.max_length_ratio}")
        if self.max_group_size < 1:
            raise BatchingSettingsError(f"max_group_size must be at least 1, got {self.max_group_size}")
        if not self.max_queue_delay_ms >= 0:
            raise BatchingSettingsError(f"max_queue_delay_ms must be >= 0, got {self.max_queue_delay_ms}")
        if not self.hold_per_prompt_token_ms >= 0:
            raise BatchingSettingsError(f"hold_per_prompt_token_ms must be >= 0, got {self.hold_per_prompt_token_ms}")
        if self.max_queue_size < 1:
            raise BatchingSettingsError(f"max_queue_size must be at least 1, got {self.max_queue_size}")
        if self.max_prefill_tokens < 1:
            raise BatchingSettingsError(f"max_prefill_tokens must be at least 1, got {self.max_prefill_tokens}")
        if not 0 <= self.hold_fraction <= 1:
            raise BatchingSettingsError(f"hold_fraction must be between 0 and 1, got {self.hold_fraction}")


# Prompts shorter than this are not measured: their evaluation time is mostly the fixed cost of a batch.
MIN_MEASURED_PROMPT_TOKENS = 16
# Per-token costs outside this range (ms) are not a prompt evaluation (a clock step, a prompt found in the cache).
MEASURED_MS_PER_TOKEN = (0.01, 1000.0)


@dataclass
class PromptEvaluationRate:
    """A moving estimate of the milliseconds llama.cpp takes per prompt token, from its own timings (`prompt_n`
    tokens evaluated in `prompt_ms`) of each admitted group. None until a prompt of at least
    MIN_MEASURED_PROMPT_TOKENS has been measured. Not thread-safe: the caller holds its own lock."""

    weight: float = 0.3
    ms_per_token: float | None = None

    def observe(self, tokens: int, ms: float) -> None:
        if tokens < MIN_MEASURED_PROMPT_TOKENS or not ms > 0:
            return
        sample = ms / tokens
        if not MEASURED_MS_PER_TOKEN[0] <= sample <= MEASURED_MS_PER_TOKEN[1]:
            return
        self.ms_per_token = sample if self.ms_per_token is None else \
            (1 - self.weight) * self.ms_per_token + self.weight * sample


@dataclass
class GroupTimings:
    """llama.cpp's timings of the prompts admitted together, gathered as each request finishes. The prompts of one
    admission are evaluated in one batch, so each one's `prompt_ms` spans the whole batch: the group's rate is
    its longest `prompt_ms` over all its evaluated tokens, observed once every member has reported."""

    members: int
    tokens: int = 0
    ms: float = 0.0
    reported: int = 0

    def report(self, prompt_n: int | None, prompt_ms: float | None) -> bool:
        """One member's timings (None when it had none: it failed or was cancelled before its prompt was
        evaluated); True once every member has reported."""
        self.reported += 1
        if prompt_n is not None and prompt_ms is not None:
            self.tokens += max(int(prompt_n), 0)
            self.ms = max(self.ms, float(prompt_ms))
        return self.reported >= self.members


@dataclass(frozen=True)
class Queued:
    key: object
    prompt_tokens: int
    arrived_ms: float
    # When this request is admitted even if no batch-mate has come (arrival plus its hold).
    due_ms: float


@dataclass
class LengthAwareQueue:
    """Requests waiting for a slot. Not thread-safe: the caller holds its own lock."""

    settings: BatchingSettings = field(default_factory=BatchingSettings)
    rate: PromptEvaluationRate = field(default_factory=PromptEvaluationRate)
    _waiting: list[Queued] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        return len(self._waiting) >= self.settings.max_queue_size

    def hold_per_token_ms(self) -> float:
        """A waiting request's hold per prompt token: `hold_fraction` of the measured evaluation cost per token,
        or `hold_per_prompt_token_ms` until one has been measured."""
        if self.rate.ms_per_token is None:
            return self.settings.hold_per_prompt_token_ms
        return self.settings.hold_fraction * self.rate.ms_per_token

    def observe(self, timings: GroupTimings) -> None:
        """A finished group's evaluation, measured by llama.cpp, for the holds of the requests that come next."""
        self.rate.observe(timings.tokens, timings.ms)

    def add(self, key: object, prompt_tokens: int, now_ms: float) -> None:
        tokens = max(int(prompt_tokens), 1)
        hold = min(tokens * self.hold_per_token_ms(), self.settings.max_queue_delay_ms)
        self._waiting.append(Queued(key, tokens, now_ms, now_ms + hold))

    def remove(self, gone: Callable[[object], bool]) -> list[Queued]:
        """Takes out every waiting request whose key `gone` says has left (its client disconnected)."""
        left = [q for q in self._waiting if gone(q.key)]
        if left:
            taken = {id(q) for q in left}
            self._waiting = [q for q in self._waiting if id(q) not in taken]
        return left

    def groups(self) -> list[list[Queued]]:
        """The waiting requests split into groups, each within the length ratio and the size bound."""
        if self.settings.policy == FIFO:
            size = self.settings.max_group_size
            return [self._waiting[i:i + size] for i in range(0, len(self._waiting), size)]
        return self._grouped(self._waiting)

    def _grouped(self, requests: list[Queued]) -> list[list[Queued]]:
        """`requests` split into length-aware groups, the shortest prompts first."""
        groups: list[list[Queued]] = []
        for q in sorted(requests, key=lambda q: (q.prompt_tokens, q.arrived_ms)):
            group = groups[-1] if groups else None
            if (group is None or len(group) >= self.settings.max_group_size
                    or q.prompt_tokens > group[0].prompt_tokens * self.settings.max_length_ratio):
                groups.append([q])
            else:
                group.append(q)
        return groups

    def take(self, free_slots: int, prefilling: int, now_ms: float, evaluating: tuple[int, ...] = ()) -> list[Queued]:
        """The requests to admit now (oldest first within their group), at most `free_slots` of them.

        `prefilling`: admitted requests whose prompt is still being evaluated. Length-aware admission lets one
        group's prompts be evaluated at a time, among the requests the free slots are kept for (`slot_holders`):
        while none is evaluated and some group is due (full, or holding a request past its hold), the group with the
        shortest prompts goes, unless a group has waited `STARVATION_DELAYS` times `max_queue_delay_ms`: the oldest
        such group goes first. FIFO admits the oldest requests whenever a slot is
        free. Either way the requests taken hold at most `max_prefill_tokens` prompt tokens together (at least one
        request).

        `evaluating`: the prompt tokens of those requests, when known. A group no longer than the length class of
        the prompts being evaluated may join them (within `max_prefill_tokens` in all): llama.cpp evaluates them in
        the same steps, so it delays them little, and a request given a slot freed by a running generation does not
        wait out another short prompt's first token.
        """
        if free_slots <= 0 or not self._waiting:
            return []
        joining = 0  # prompt tokens already being evaluated that a length-aware group joins
        if self.settings.policy == FIFO:
            chosen = self._waiting[:free_slots]
        else:
            if prefilling and not evaluating:
                return []

            def oldest(group):
                return min(q.arrived_ms for q in group)
            groups = self._grouped(self.slot_holders(free_slots, now_ms))
            starving = [g for g in groups if self._starving(oldest(g), now_ms)]
            if starving:
                group = min(starving, key=oldest)
            elif any(len(g) >= self.settings.max_group_size or q.due_ms <= now_ms for g in groups for q in g):
                # The shortest prompts waiting go first, even if their own hold has not ended.
                group = groups[0]
            else:
                return []
            chosen = sorted(group, key=lambda q: q.arrived_ms)[:free_slots]
            if prefilling:
                if max(q.prompt_tokens for q in chosen) > min(evaluating) * self.settings.max_length_ratio:
                    return []
                joining = sum(evaluating)
        chosen = self._within_prefill_budget(chosen, joining)
        taken = {id(q) for q in chosen}
        self._waiting = [q for q in self._waiting if id(q) not in taken]
        return chosen

    def slot_holders(self, free_slots: int, now_ms: float) -> list[Queued]:
        """The waiting requests that the `free_slots` slots are kept for (length-aware admission): every one when
        they fit; otherwise those that have waited `STARVATION_DELAYS` delays (oldest first), then the longest length
        classes (`slot_choice` longest_first: the requests left waiting for a slot freed later are the cheapest to
        evaluate once they get it) or the shortest ones, oldest first within a class. Their prompts are evaluated
        shortest group first either way."""
        if len(self._waiting) <= free_slots:
            return list(self._waiting)
        starving = sorted((q for q in self._waiting if self._starving(q.arrived_ms, now_ms)), key=lambda q: q.arrived_ms)
        classes = self._grouped([q for q in self._waiting if not self._starving(q.arrived_ms, now_ms)])
        if self.settings.slot_choice == LONGEST_FIRST:
            classes.reverse()
        ordered = [q for group in classes for q in sorted(group, key=lambda q: q.arrived_ms)]
        return (starving + ordered)[:max(free_slots, 0)]

    def _starving(self, arrived_ms: float, now_ms: float) -> bool:
        return now_ms - arrived_ms >= self.settings.max_queue_delay_ms * STARVATION_DELAYS

    def _within_prefill_budget(self, chosen: list[Queued], evaluating_tokens: int = 0) -> list[Queued]:
        """The first of `chosen` whose prompts, with `evaluating_tokens` already being evaluated, stay within
        max_prefill_tokens (the first one always when nothing is being evaluated)."""
        total, kept = evaluating_tokens, []
        for q in chosen:
            total += q.prompt_tokens
            if (kept or evaluating_tokens) and total > self.settings.max_prefill_tokens:
                break
            kept.append(q)
        return kept

    def drain(self) -> list[Queued]:
        """Every waiting request, oldest first (the engine is stopping: each still gets its answer)."""
        waiting, self._waiting = sorted(self._waiting, key=lambda q: q.arrived_ms), []
        return waiting

    def next_deadline_ms(self) -> float | None:
        """When the first waiting request's hold ends (the scheduler wakes then)."""
        if not self._waiting:
            return None
        return min(q.due_ms for q in self._waiting)
