"""risk_stream's arrival loop: each request of a batch gets exactly one final answer, whatever it carries.

The model decodes Triton requests into `Arrival`s and turns `Answer`s into responses; everything in between is
here, without Triton: the record's place in its stream (`sequence_id`, within 0..2^63-1), one scoring call for
the batch (bad records isolated), the reorder buffers, and the decision for every id the stream cannot use:

| the record | its answer |
|---|---|
| no usable `sequence_id` (missing, not an integer, negative, beyond int64) or malformed | an error naming the field |
| below the first id of its stream (stale) | an error naming `sequence_id` |
| already answered, or waiting | status `DUPLICATE` |
| its stream's buffer is full | an `Unavailable` error |
| in turn / given up earlier | `OK` / `LATE` with its scores, or its scoring error |

Answers are delivered one by one under the session's lock, so a stream's answers leave in order; a delivery that
fails is logged and, when it was a final answer, replaced by an internal error for that request, and the rest of
the round is still delivered: no answer taken out of a buffer is ever lost.
"""
from __future__ import annotations

import math
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Sequence, TypeVar

from s2t.backends.scoring.batch_scoring import ScoreBatch, Scored, score_isolating_bad_records
from s2t.backends.runtime.serving_errors import InternalError, InvalidInput, ServingError, Unavailable
from s2t.backends.runtime.model_parameters import parameter, settings_of
from s2t.backends.records.record_decoder import (DEFAULT_MAX_RECORD_BYTES, RecordError, max_record_bytes_parameter,
                                                 parse_record, stream_position)
from s2t.backends.streaming.reorder_buffer import GAP, IN_ORDER, BufferFull, Emission, ReorderSettings, StreamTable

T = TypeVar("T")

OK, LATE, DUPLICATE = "OK", "LATE", "DUPLICATE"


@dataclass(frozen=True)
class StreamModelSettings:
    """risk_stream's parameters: the model that scores, the reordering, the size limit of one record."""

    scoring_model: str = parameter("scoring_model", "risk_pipeline")
    max_record_bytes: int = max_record_bytes_parameter()
    reorder: ReorderSettings = settings_of(ReorderSettings)


def check_sequence_batching(settings: StreamModelSettings, sequence_batching: dict) -> None:
    """Refuse a config whose batcher can hold more streams than the model keeps state for: Triton would pass records
    of streams the model had to evict to make room, and they would lose their order. (Triton's config JSON spells
    uint64 fields as strings.)"""
    slots = int((sequence_batching.get("oldest") or {}).get("max_candidate_sequences") or 0)
    if slots > settings.reorder.max_streams:
        raise ValueError(f"max_streams ({settings.reorder.max_streams}) must be at least sequence_batching's "
                         f"max_candidate_sequences ({slots}): every stream Triton holds a slot for keeps its state")


@dataclass(frozen=True)
class Arrival(Generic[T]):
    """One request: `token` is what the model answers it through (its response sender). `error` is set when the
    request cannot carry a record (not exactly one payload)."""

    token: T
    stream: Hashable
    start: bool = False
    end: bool = False
    payload: bytes | None = None
    error: ServingError | None = None

    @classmethod
    def of_request(cls, token: T, stream: Hashable, start: bool, end: bool, payloads: Sequence) -> "Arrival[T]":
        if len(payloads) != 1:
            return cls(token, stream, start, end, error=InvalidInput(
                f"payload: a stream request carries one record, got {len(payloads)}"))
        return cls(token, stream, start, end, payload=payloads[0])


@dataclass(frozen=True)
class Answer(Generic[T]):
    """One response. With `error`, the request's final answer is that error; otherwise the outputs. A GAP answer
    is not final: the answer of the record that carries it follows on the same token."""

    token: T
    final: bool
    status: str = ""
    sequence_id: int = 0
    last_id: int = 0
    probability: float = math.nan
    decision: bytes = b""
    error: ServingError | None = None

    @property
    def status_text(self) -> str:
        return f"GAP {self.sequence_id}-{self.last_id}" if self.status == GAP else self.status


@dataclass(frozen=True)
class _Pending(Generic[T]):
    token: T
    scored: Scored


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def _named(stream: Hashable, limit: int = 40) -> str:
    """The stream (a client's correlation id) for a message, cut short."""
    text = str(stream)
    return text if len(text) <= limit else f"{text[:limit]}..."


class StreamSession(Generic[T]):
    def __init__(self, settings: ReorderSettings, score_batch: ScoreBatch, deliver: Callable[[Answer[T]], None],
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, log: Callable[[str], None] = lambda text: None,
                 clock_ms: Callable[[], float] = _now_ms):
        self.settings = settings
        self._score_batch, self._deliver, self._log, self._clock_ms = score_batch, deliver, log, clock_ms
        self._max_record_bytes = max_record_bytes
        self._table: StreamTable[_Pending[T]] = StreamTable(settings)
        self._lock = threading.Lock()
        self.delivery_failures = 0

    def arrive(self, arrivals: Sequence[Arrival[T]]) -> bool:
        """Answer or buffer every arrival; True when a record now waits for a missing id (the timer's cue)."""
        positions = [self._position(a) for a in arrivals]
        placed = [i for i, p in enumerate(positions) if isinstance(p, int)]
        scored = dict(zip(placed, score_isolating_bad_records([arrivals[i].payload for i in placed],
                                                              self._score_batch)))
        waiting = False
        with self._lock:
            now = self._clock_ms()
            for i, (arrival, position) in enumerate(zip(arrivals, positions)):
                answers = []
                try:
                    if arrival.start:
                        answers += self._answers(self._table.start(arrival.stream, now))
                    if isinstance(position, int):
                        offered, waits = self._offer(arrival, position, scored[i], now)
                        answers += offered
                        waiting |= waits
                    else:
                        answers.append(Answer(arrival.token, True, error=position))
                    if arrival.end:
                        answers += self._answers(self._table.end(arrival.stream))
                except Exception:  # noqa: BLE001 - a fault here must not cost the other arrivals their answers
                    self._log(traceback.format_exc())
                    answers.append(Answer(arrival.token, True, error=InternalError("risk_stream: internal error")))
                self._deliver_all(answers)
        return waiting

    def expire(self) -> float | None:
        """Give up what waited past its deadline, forget idle streams; the next deadline (ms), if any."""
        with self._lock:
            self._deliver_all(self._answers(self._table.expire(self._clock_ms())))
            return self._table.next_deadline_ms()

    def close(self) -> None:
        """Every stream ends: whatever waits is answered."""
        with self._lock:
            self._deliver_all(self._answers(self._table.end_all()))

    def snapshot(self) -> tuple[dict[str, int], int, int]:
        """(counts, records buffered, streams) for the metrics."""
        with self._lock:
            return dict(vars(self._table.counts)), self._table.buffered, len(self._table)

    def _position(self, arrival: Arrival[T]) -> int | ServingError:
        if arrival.error is not None:
            return arrival.error
        try:
            return stream_position(parse_record(arrival.payload, self._max_record_bytes), str(arrival.stream))
        except RecordError as err:
            return err

    def _offer(self, arrival: Arrival[T], sequence_id: int, scored: Scored, now: float) -> tuple[list, bool]:
        try:
            offer = self._table.offer(arrival.stream, sequence_id, _Pending(arrival.token, scored), now)
        except BufferFull as err:
            return [Answer(arrival.token, True, error=Unavailable(
                f"sequence_id {sequence_id}: reorder buffer of stream {_named(arrival.stream)} full, {err}"))], False
        if offer.stale:
            first = self._table.first_id(arrival.stream)
            return [Answer(arrival.token, True, error=InvalidInput(
                f"sequence_id {sequence_id}: below {first}, the first id of stream {_named(arrival.stream)}"))], False
        if offer.duplicate:
            return [Answer(arrival.token, True, DUPLICATE, sequence_id, sequence_id)], False
        return self._answers(offer.emissions), offer.reordered

    @staticmethod
    def _answers(emissions: Sequence[Emission[_Pending[T]]]) -> list[Answer[T]]:
        answers = []
        for e in emissions:
            if e.status == GAP:
                answers.append(Answer(e.item.token, False, GAP, e.sequence_id, e.last_id))
                continue
            scored = e.item.scored
            if scored.error is not None:
                error = type(scored.error)(f"sequence_id {e.sequence_id}: {scored.error.message}")
                answers.append(Answer(e.item.token, True, error=error))
            else:
                answers.append(Answer(e.item.token, True, OK if e.status == IN_ORDER else e.status, e.sequence_id,
                                      e.sequence_id, scored.probability, scored.decision))
        return answers

    def _deliver_all(self, answers: Sequence[Answer[T]]) -> None:
        for answer in answers:
            try:
                self._deliver(answer)
            except Exception:  # noqa: BLE001 - the next answers of the round still go out
                self.delivery_failures += 1
                self._log(traceback.format_exc())
                if answer.final and answer.error is None:
                    self._deliver_error_instead(answer)

    def _deliver_error_instead(self, answer: Answer[T]) -> None:
        try:
            self._deliver(Answer(answer.token, True, error=InternalError("risk_stream: internal error")))
        except Exception:  # noqa: BLE001 - nothing more can be sent to this request
            self._log(traceback.format_exc())
