"""One `skill.Skill/Score` call (s2t/wire/skill.proto) as both its servers read it: the legacy service and the gateway
that replaced it.

The caller streams its records and gets one `SkillBatchResult` when it closes its side; the records are scored in
fixed-size windows in arrival order (the reply says `window_size` and how many `windows`), and a call that cannot be
answered record by record is refused as a whole with a gRPC status (`CallRefused`).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Iterable, Iterator

import grpc


class CallRefused(Exception):
    """The call as a whole is refused with `code`; `details` tells the caller why, `retry_after_s` when to retry."""

    def __init__(self, code: grpc.StatusCode, details: str, retry_after_s: float | None = None):
        super().__init__(details)
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s


def too_many_records(max_records: int) -> CallRefused:
    return CallRefused(grpc.StatusCode.INVALID_ARGUMENT,
                       f"a call carries at most {max_records} records; send the rest in another call")


_END = object()


def records_within(request_iterator: Iterator, timeout_s: float, max_records: int,
                   clock=time.monotonic) -> Iterator:
    """For a thread-per-call server (the legacy service): the caller's records as they arrive, until it closes its
    side; CallRefused once `timeout_s` have passed since the call began (an idle stream included) or past
    `max_records`. A reader thread waits on the caller, so the handler can give up on a caller that sends nothing;
    its queue is bounded, so a fast caller is held back by gRPC's flow control rather than buffered here."""
    arrivals: queue.Queue = queue.Queue(maxsize=256)
    done = threading.Event()

    def offer(item) -> bool:
        try:
            arrivals.put(item, timeout=0.2)
            return True
        except queue.Full:
            return False

    def read():
        try:
            for record in request_iterator:
                while not offer(record):
                    if done.is_set():
                        return
        except Exception as err:  # noqa: BLE001 - the caller went away, or the call ended: the handler sees why
            offer(err)
            return
        while not offer(_END) and not done.is_set():
            pass

    threading.Thread(target=read, name="skill-call-reader", daemon=True).start()
    end = clock() + timeout_s
    count = 0
    try:
        while True:
            try:
                item = arrivals.get(timeout=max(end - clock(), 0.0))
            except queue.Empty:
                raise CallRefused(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"the call took longer than {timeout_s:g} s (the service's limit)") from None
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            count += 1
            if count > max_records:
                raise too_many_records(max_records)
            yield item
    finally:
        done.set()


def windows(records: Iterable, size: int) -> Iterable[list]:
    """Fixed-size windows in arrival order; the last one holds the rest."""
    window = []
    for record in records:
        window.append(record)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window
