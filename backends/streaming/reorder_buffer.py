"""Per-stream reordering: records arrive in any order, answers leave strictly in sequence order, once each.

A stream expects the ids `first_sequence_id`, `first_sequence_id + 1`, ... A record ahead of the next expected
id waits in the stream's buffer; the missing ids before it are given up (one GAP answer naming them) when

- the record is more than `max_gap` ids ahead (the window slides: the oldest missing ids go first),
- `reorder_timeout_ms` has passed since a buffered record first showed that the id is missing,
- or the stream ends.

An id at or below the watermark is a duplicate (counted; the caller answers it DUPLICATE) unless it was given up:
then it is answered LATE, once. An id below the stream's first id is stale: it was never part of this stream.
Nothing here knows Triton; `item` is whatever the caller needs to answer the record later.
"""
from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, Hashable, TypeVar

from s2t.backends.runtime.model_parameters import parameter

T = TypeVar("T")

IN_ORDER, GAP, LATE = "IN_ORDER", "GAP", "LATE"
# Given-up ranges remembered per stream to tell a late record from a duplicate; beyond this many ranges the
# oldest are forgotten and a record from them is dropped as a duplicate (it was already answered GAP).
MAX_SKIPPED_RANGES = 64


class BufferFull(RuntimeError):
    """The stream already holds `max_buffered` records waiting for a missing id."""


@dataclass(frozen=True)
class ReorderSettings:
    max_gap: int = parameter("max_gap", 10)
    reorder_timeout_ms: float = parameter("reorder_timeout_ms", 200.0)
    max_buffered: int = parameter("max_buffered", 64)
    first_sequence_id: int = parameter("first_sequence_id", 0)
    stream_idle_ms: float = parameter("stream_idle_ms", 5_000.0)
    # Streams with state at once; a new one beyond it evicts the longest idle (its waiting records answered first).
    max_streams: int = parameter("max_streams", 4096)

    def __post_init__(self):
        if self.max_gap < 0:
            raise ValueError(f"max_gap must be >= 0, got {self.max_gap}")
        if self.reorder_timeout_ms <= 0:
            raise ValueError(f"reorder_timeout_ms must be positive, got {self.reorder_timeout_ms}")
        if self.max_buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {self.max_buffered}")
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {self.max_streams}")
        if self.stream_idle_ms < self.reorder_timeout_ms:
            raise ValueError(f"stream_idle_ms ({self.stream_idle_ms}) must not be below reorder_timeout_ms "
                             f"({self.reorder_timeout_ms}): a stream would be evicted with records still waiting")


@dataclass(frozen=True)
class Emission(Generic[T]):
    """One answer. IN_ORDER and LATE: the record `sequence_id` with its `item`. GAP: the ids `sequence_id` to
    `last_id` were given up; `item` is the record whose answer carries the GAP (the one that follows it)."""

    status: str
    sequence_id: int
    last_id: int
    item: T


@dataclass
class Offer(Generic[T]):
    emissions: list[Emission[T]] = field(default_factory=list)
    duplicate: bool = False  # already answered, or waiting
    stale: bool = False  # below the stream's first id
    reordered: bool = False  # the record arrived ahead of a missing id and had to wait


class StreamReorder(Generic[T]):
    def __init__(self, settings: ReorderSettings, now_ms: float, first_id: int | None = None):
        self.settings = settings
        self.next_id = self.first_id = settings.first_sequence_id if first_id is None else first_id
        self.last_seen_ms = now_ms
        self._buffer: dict[int, tuple[T, float]] = {}
        self._skipped: list[tuple[int, int]] = []  # sorted, disjoint, inclusive ranges not yet answered LATE

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def offer(self, sequence_id: int, item: T, now_ms: float) -> Offer[T]:
        self.last_seen_ms = now_ms
        if sequence_id < self.first_id:
            return Offer(stale=True)
        if sequence_id < self.next_id:
            if self._take_skipped(sequence_id):
                return Offer([Emission(LATE, sequence_id, sequence_id, item)])
            return Offer(duplicate=True)
        if sequence_id in self._buffer:
            return Offer(duplicate=True)
        if sequence_id == self.next_id:
            self.next_id += 1
            return Offer([Emission(IN_ORDER, sequence_id, sequence_id, item)] + self._drain())
        # Refused before anything changes, so a refused record leaves the stream as it was.
        if len(self._buffer) >= self.settings.max_buffered:
            raise BufferFull(f"{len(self._buffer)} records already wait for sequence_id {self.next_id} "
                             f"(max_buffered {self.settings.max_buffered})")
        self._buffer[sequence_id] = (item, now_ms)
        emissions = []
        if sequence_id - self.next_id > self.settings.max_gap:
            emissions = self._advance_to(sequence_id - self.settings.max_gap, carrier=item)
        return Offer(emissions, reordered=sequence_id in self._buffer)

    def next_deadline_ms(self) -> float | None:
        """When the next expected id is given up, unless it arrives first; None when nothing waits."""
        if not self._buffer:
            return None
        return min(arrived for _, arrived in self._buffer.values()) + self.settings.reorder_timeout_ms

    def expire(self, now_ms: float) -> list[Emission[T]]:
        emissions = []
        while (deadline := self.next_deadline_ms()) is not None and deadline <= now_ms:
            emissions += self._advance_to(min(self._buffer), carrier=None)
        return emissions

    def end(self) -> list[Emission[T]]:
        """Sequence end: every waiting record is answered, with the missing ids before it as GAP."""
        if not self._buffer:
            return []
        return self._advance_to(max(self._buffer) + 1, carrier=None)

    def _drain(self) -> list[Emission[T]]:
        emissions = []
        while self.next_id in self._buffer:
            item, _ = self._buffer.pop(self.next_id)
            emissions.append(Emission(IN_ORDER, self.next_id, self.next_id, item))
            self.next_id += 1
        return emissions

    def _advance_to(self, target: int, carrier: T | None) -> list[Emission[T]]:
        """Answer everything below `target` in order, GAP for each run of missing ids, then drain."""
        emissions: list[Emission] = []
        for sequence_id in sorted(i for i in self._buffer if i < target):
            if sequence_id > self.next_id:
                emissions.append(self._gap(self.next_id, sequence_id - 1))
            item, _ = self._buffer.pop(sequence_id)
            emissions.append(Emission(IN_ORDER, sequence_id, sequence_id, item))
            self.next_id = sequence_id + 1
        if target > self.next_id:
            emissions.append(self._gap(self.next_id, target - 1))
            self.next_id = target
        emissions += self._drain()
        # A GAP travels with the answer of the record that follows it; with none in this round (the window slid
        # to an id that has not arrived), with the record that forced the slide.
        carried, follower = [], carrier
        for emission in reversed(emissions):
            if emission.status == GAP:
                emission = Emission(GAP, emission.sequence_id, emission.last_id, follower)
            else:
                follower = emission.item
            carried.append(emission)
        return carried[::-1]

    def _gap(self, first: int, last: int) -> Emission:
        self._skipped.append((first, last))
        del self._skipped[:-MAX_SKIPPED_RANGES]
        return Emission(GAP, first, last, None)

    def _take_skipped(self, sequence_id: int) -> bool:
        i = bisect.bisect_right(self._skipped, (sequence_id, float("inf"))) - 1
        if i < 0 or not (self._skipped[i][0] <= sequence_id <= self._skipped[i][1]):
            return False
        first, last = self._skipped.pop(i)
        self._skipped[i:i] = [r for r in ((first, sequence_id - 1), (sequence_id + 1, last)) if r[0] <= r[1]]
        return True


@dataclass
class Counts:
    reordered: int = 0
    duplicate: int = 0
    stale: int = 0
    late: int = 0
    gap: int = 0  # ids given up
    overflow: int = 0
    evicted: int = 0


class StreamTable(Generic[T]):
    """All streams of one model instance: start, offer, end, and the timer's expire (which also evicts idle
    streams). At most `max_streams` have state: a new stream beyond it evicts the one that has been quiet longest,
    so state is bounded by configuration whatever clients open. `counts` accumulate for the metrics."""

    def __init__(self, settings: ReorderSettings):
        self.settings = settings
        self.counts = Counts()
        # Least recently heard from first: the eviction candidate is always at the front.
        self._streams: OrderedDict[Hashable, StreamReorder[T]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._streams)

    @property
    def buffered(self) -> int:
        return sum(s.buffered for s in self._streams.values())

    def start(self, stream: Hashable, now_ms: float) -> list[Emission[T]]:
        """A new sequence on this id: whatever the old one still held is answered first."""
        emissions = self.end(stream) + self._make_room()
        self._streams[stream] = StreamReorder(self.settings, now_ms)
        return emissions

    def offer(self, stream: Hashable, sequence_id: int, item: T, now_ms: float) -> Offer[T]:
        reorder, evicted = self._streams.get(stream), []
        if reorder is None:
            # A stream seen without its start (evicted while idle, or an instance restarted): it goes on from
            # here rather than from first_sequence_id, which would give up every id in between as one GAP.
            evicted = self._make_room()
            reorder = self._streams[stream] = StreamReorder(self.settings, now_ms, first_id=sequence_id)
        else:
            self._streams.move_to_end(stream)
        try:
            offer = reorder.offer(sequence_id, item, now_ms)
        except BufferFull:  # never a new stream's (its buffer is empty): nothing evicted is lost here
            self.counts.overflow += 1
            raise
        offer.emissions = evicted + offer.emissions
        self.counts.duplicate += offer.duplicate
        self.counts.stale += offer.stale
        self.counts.reordered += offer.reordered
        self._count(offer.emissions)
        return offer

    def first_id(self, stream: Hashable) -> int | None:
        reorder = self._streams.get(stream)
        return None if reorder is None else reorder.first_id

    def end(self, stream: Hashable) -> list[Emission[T]]:
        reorder = self._streams.pop(stream, None)
        return self._count(reorder.end()) if reorder else []

    def expire(self, now_ms: float) -> list[Emission[T]]:
        emissions = []
        for stream, reorder in list(self._streams.items()):
            emissions += reorder.expire(now_ms)
            if not reorder.buffered and now_ms - reorder.last_seen_ms >= self.settings.stream_idle_ms:
                del self._streams[stream]
                self.counts.evicted += 1
        return self._count(emissions)

    def next_deadline_ms(self) -> float | None:
        deadlines = [d for d in (s.next_deadline_ms() for s in self._streams.values()) if d is not None]
        idle = [s.last_seen_ms + self.settings.stream_idle_ms for s in self._streams.values()]
        return min(deadlines + idle, default=None)

    def _make_room(self) -> list[Emission[T]]:
        """Evict the longest quiet stream while the table is full; its waiting records are answered (GAP before
        any missing id), so nothing taken in is lost."""
        emissions = []
        while len(self._streams) >= self.settings.max_streams:
            stream = next(iter(self._streams))
            emissions += self.end(stream)
            self.counts.evicted += 1
        return emissions

    def end_all(self) -> list[Emission[T]]:
        emissions = []
        for stream in list(self._streams):
            emissions += self.end(stream)
        return emissions

    def _count(self, emissions: list[Emission[T]]) -> list[Emission[T]]:
        for e in emissions:
            if e.status == GAP:
                self.counts.gap += e.last_id - e.sequence_id + 1
            elif e.status == LATE:
                self.counts.late += 1
        return emissions
