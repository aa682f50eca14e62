"""Score many records in one call, yet answer each bad record on its own.

Triton fails a whole request when one of its records is bad, so a caller that batches records from different
senders (the legacy gateway's windows, risk_stream's batches across streams) calls once for all of them and,
only when that call is refused for a bad record, once per record: the good records are scored, and each bad one
gets the adapter's own message for it.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import numpy as np

from s2t.backends.runtime.serving_errors import INVALID, UNAVAILABLE, InternalError, NotAnsweredInTime, ServingError


@dataclass(frozen=True)
class Scored:
    probability: float
    decision: bytes
    error: ServingError | None = None


ScoreBatch = Callable[[Sequence[bytes]], tuple[np.ndarray, np.ndarray]]
AsyncScoreBatch = Callable[[Sequence[bytes]], Awaitable[tuple[np.ndarray, np.ndarray]]]


def retrying(score_batch: ScoreBatch, backoff_s: Sequence[float] = (0.05, 0.2),
             sleep: Callable[[float], None] = time.sleep) -> ScoreBatch:
    """`score_batch` (which raises ServingError), tried again after each pause of `backoff_s` while it fails
    UNAVAILABLE. Triton sheds load by refusing a request that waited past its queue timeout; a short, bounded retry
    rides out a burst, and a server that stays overloaded or unreachable still fails after the last pause. A request
    not answered in time (NotAnsweredInTime) may still be running: it is not sent again."""
    def score(payloads: Sequence[bytes]):
        for pause in backoff_s:
            try:
                return score_batch(payloads)
            except ServingError as err:
                if not _worth_retrying(err):
                    raise
            sleep(pause)
        return score_batch(payloads)
    return score


def score_isolating_bad_records(payloads: Sequence[bytes], score_batch: ScoreBatch) -> list[Scored]:
    if not payloads:
        return []
    try:
        probabilities, decisions = score_batch(payloads)
    except ServingError as err:
        if err.kind != INVALID or len(payloads) == 1:
            return [Scored(float("nan"), b"", err)] * len(payloads)
        return [score_isolating_bad_records([p], score_batch)[0] for p in payloads]
    return _scored(payloads, probabilities, decisions)


def retrying_async(score_batch: AsyncScoreBatch, backoff_s: Sequence[float] = (0.05, 0.2)) -> AsyncScoreBatch:
    """`retrying` for a coroutine scorer: the pauses wait on the event loop, not on a thread."""
    async def score(payloads: Sequence[bytes]):
        for pause in backoff_s:
            try:
                return await score_batch(payloads)
            except ServingError as err:
                if not _worth_retrying(err):
                    raise
            await asyncio.sleep(pause)
        return await score_batch(payloads)
    return score


def _worth_retrying(err: ServingError) -> bool:
    return err.kind == UNAVAILABLE and not isinstance(err, NotAnsweredInTime)


async def score_isolating_bad_records_async(payloads: Sequence[bytes], score_batch: AsyncScoreBatch) -> list[Scored]:
    """`score_isolating_bad_records` for a coroutine scorer; the records of a refused batch are retried side by
    side."""
    if not payloads:
        return []
    try:
        probabilities, decisions = await score_batch(payloads)
    except ServingError as err:
        if err.kind != INVALID or len(payloads) == 1:
            return [Scored(float("nan"), b"", err)] * len(payloads)
        singles = await asyncio.gather(*(score_isolating_bad_records_async([p], score_batch) for p in payloads))
        return [single[0] for single in singles]
    return _scored(payloads, probabilities, decisions)


def _scored(payloads: Sequence[bytes], probabilities, decisions) -> list[Scored]:
    probabilities, decisions = np.asarray(probabilities).ravel(), np.asarray(decisions).ravel()
    if len(probabilities) != len(payloads) or len(decisions) != len(payloads):
        error = InternalError(f"{len(probabilities)} scores for {len(payloads)} records")
        return [Scored(float("nan"), b"", error)] * len(payloads)
    # tolist(): Python floats in one call, not a numpy scalar per record.
    return [Scored(p, bytes(d), None) for p, d in zip(probabilities.astype(np.float64, copy=False).tolist(), decisions)]
