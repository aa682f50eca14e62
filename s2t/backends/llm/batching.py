"""Admission of queued generation requests into the engine's slots, grouped by prompt length.

The engine (llama.cpp's server) evaluates the prompts of every slot admitted together in one batch, so a short
prompt admitted beside a long one gets its first token only once the long prompt has been evaluated. Length-aware
admission keeps such requests apart: a group never holds prompts whose token counts differ by more than
`max_length_ratio`, holds at most `max_group_size` requests, and waits at most `max_queue_delay_ms` for
batch-mates; one group's prompts are evaluated at a time. When a group is full or has waited the delay, the group
with the shortest prompts is admitted (a group that has waited ten delays goes first, so long prompts are never
starved).

`fifo` admission, the baseline, takes the oldest requests whatever their lengths.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from s2t.backends.runtime.model_parameters import parameter

LENGTH_AWARE = "length_aware"
FIFO = "fifo"
POLICIES = (LENGTH_AWARE, FIFO)
# A group waiting this many queue delays goes before shorter ones: long prompts are delayed, never starved.
STARVATION_DELAYS = 10


class BatchingSettingsError(ValueError):
    pass


@dataclass(frozen=True)
class BatchingSettings:
    policy: str = parameter("batching_policy", LENGTH_AWARE)
    max_length_ratio: float = parameter("max_length_ratio", 3.0)
    max_group_size: int = parameter("max_group_size", 32)
    max_queue_delay_ms: float = parameter("max_queue_delay_ms", 200.0)
    # Requests waiting for a slot; one more is refused at once, so a flood cannot hold everyone else for minutes.
    max_queue_size: int = parameter("max_queue_size", 64)
    # Prompt tokens admitted for evaluation at once (one prompt at least): the engine cannot stop a prompt's
    # evaluation, so this bounds how long a new request waits behind prompts already admitted.
    max_prefill_tokens: int = parameter("max_prefill_tokens", 1024)

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise BatchingSettingsError(f"batching_policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not self.max_length_ratio >= 1.0:
            raise BatchingSettingsError(f"max_length_ratio must be at least 1, got {self.max_length_ratio}")
        if self.max_group_size < 1:
            raise BatchingSettingsError(f"max_group_size must be at least 1, got {self.max_group_size}")
        if not self.max_queue_delay_ms >= 0:
            raise BatchingSettingsError(f"max_queue_delay_ms must be >= 0, got {self.max_queue_delay_ms}")
        if self.max_queue_size < 1:
            raise BatchingSettingsError(f"max_queue_size must be at least 1, got {self.max_queue_size}")
        if self.max_prefill_tokens < 1:
            raise BatchingSettingsError(f"max_prefill_tokens must be at least 1, got {self.max_prefill_tokens}")


@dataclass(frozen=True)
class Queued:
    key: object
    prompt_tokens: int
    arrived_ms: float


@dataclass
class LengthAwareQueue:
    """Requests waiting for a slot. Not thread-safe: the caller holds its own lock."""

    settings: BatchingSettings = field(default_factory=BatchingSettings)
    _waiting: list[Queued] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        return len(self._waiting) >= self.settings.max_queue_size

    def add(self, key: object, prompt_tokens: int, now_ms: float) -> None:
        self._waiting.append(Queued(key, max(int(prompt_tokens), 1), now_ms))

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
        groups: list[list[Queued]] = []
        for q in sorted(self._waiting, key=lambda q: (q.prompt_tokens, q.arrived_ms)):
            group = groups[-1] if groups else None
            if (group is None or len(group) >= self.settings.max_group_size
                    or q.prompt_tokens > group[0].prompt_tokens * self.settings.max_length_ratio):
                groups.append([q])
            else:
                group.append(q)
        return groups

    def take(self, free_slots: int, prefilling: int, now_ms: float) -> list[Queued]:
        """The requests to admit now (oldest first within their group), at most `free_slots` of them.

        `prefilling`: admitted requests whose prompt is still being evaluated. Length-aware admission lets one
        group's prompts be evaluated at a time. It admits when some group is full or has waited
        `max_queue_delay_ms`, and then takes the group with the shortest prompts, unless a group has waited
        `STARVATION_DELAYS` times the delay: the oldest such group goes first. FIFO admits the oldest requests
        whenever a slot is free. Either way the requests taken hold at most `max_prefill_tokens` prompt tokens
        together (at least one request).
        """
        if free_slots <= 0 or not self._waiting:
            return []
        if self.settings.policy == FIFO:
            chosen = self._waiting[:free_slots]
        else:
            if prefilling:
                return []
            delay = self.settings.max_queue_delay_ms

            def oldest(group):
                return min(q.arrived_ms for q in group)
            groups = self.groups()
            if not any(len(g) >= self.settings.max_group_size or now_ms - oldest(g) >= delay for g in groups):
                return []
            starving = [g for g in groups if now_ms - oldest(g) >= delay * STARVATION_DELAYS]
            group = min(starving, key=oldest) if starving else groups[0]
            chosen = sorted(group, key=lambda q: q.arrived_ms)[:free_slots]
        chosen = self._within_prefill_budget(chosen)
        taken = {id(q) for q in chosen}
        self._waiting = [q for q in self._waiting if id(q) not in taken]
        return chosen

    def _within_prefill_budget(self, chosen: list[Queued]) -> list[Queued]:
        """The first of `chosen` whose prompts together stay within max_prefill_tokens (the first one always)."""
        total, kept = 0, []
        for q in chosen:
            total += q.prompt_tokens
            if kept and total > self.settings.max_prefill_tokens:
                break
            kept.append(q)
        return kept

    def drain(self) -> list[Queued]:
        """Every waiting request, oldest first (the engine is stopping: each still gets its answer)."""
        waiting, self._waiting = sorted(self._waiting, key=lambda q: q.arrived_ms), []
        return waiting

    def next_deadline_ms(self) -> float | None:
        """When the oldest waiting request reaches the delay (the scheduler wakes then)."""
        if not self._waiting:
            return None
        return min(q.arrived_ms for q in self._waiting) + self.settings.max_queue_delay_ms
