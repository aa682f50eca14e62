"""What keeps risk_stream's session going between requests: the timer that gives up missing ids and evicts idle
streams, and the counters it reports to Prometheus. Metric families come in as a parameter (Triton's
pb_utils.MetricFamily in the model), so both run in unit tests without a server."""
from __future__ import annotations

import threading
import time
import traceback
from typing import Callable

from s2t.backends.runtime import fault_points
from s2t.backends.streaming.session import StreamSession

# Checked at least this often for idle streams, even when no record waits.
IDLE_CHECK_SECONDS = 1.0
COUNTERS = {
    "reordered": "records that arrived ahead of a missing id and waited in a reorder buffer",
    "duplicate": "records answered DUPLICATE: their sequence_id was already answered or waiting",
    "stale": "records refused because their sequence_id is below the first id of their stream",
    "late": "records answered LATE: their sequence_id had already been given up as GAP",
    "gap": "sequence ids given up (answered GAP)",
    "overflow": "records refused because their stream's reorder buffer was full",
    "evicted": "streams whose state was dropped: quiet past stream_idle_ms, or the quietest when max_streams was "
               "reached",
}


class StreamMetrics:
    """`s2t_stream_*`: the session's counts as counters (increments since the last report), buffers as gauges.

    execute and the timer both report. Each report reads the session and updates Triton under one lock, so reports
    reach Triton in the order their counts were read: a count read before another report's, applied after it, would
    be an increment below zero, which Triton 2.51 refuses, and a refused metric update corrupts the stub's shared
    memory (its next allocation dies of a SIGSEGV holding the lock the server then aborts on). A report that fails
    anyway is logged: it must not fail the execute that made it, whose requests are already answered or waiting."""

    def __init__(self, metric_family, labels: dict[str, str], log: Callable[[str], None] = lambda text: None):
        counter, gauge = metric_family.COUNTER, metric_family.GAUGE
        # The families must outlive their metrics (Triton refuses updates once a family is collected).
        self._families = {name: metric_family(f"s2t_stream_{name}_total", text, counter)
                          for name, text in COUNTERS.items()}
        self._families["buffered"] = metric_family("s2t_stream_buffered", "records waiting in reorder buffers", gauge)
        self._families["streams"] = metric_family("s2t_stream_streams", "streams with reorder state", gauge)
        self._families["undelivered"] = metric_family(
            "s2t_stream_delivery_failures_total", "answers that could not be sent (an error was sent instead)", counter)
        self._metrics = {name: family.Metric(labels=labels) for name, family in self._families.items()}
        self._reported = {name: 0 for name in (*COUNTERS, "undelivered")}
        self._gauges: dict[str, int] = {}
        self._log = log
        self._lock = threading.Lock()

    def report(self, session: StreamSession) -> None:
        with self._lock:
            try:
                counts, buffered, streams = session.snapshot()
                counts["undelivered"] = session.delivery_failures
                for name, reported in self._reported.items():
                    if counts[name] > reported:
                        self._metrics[name].increment(counts[name] - reported)
                        self._reported[name] = counts[name]
                # Each update is a round trip to the server: a gauge that has not moved is left as it is.
                for name, value in (("buffered", buffered), ("streams", streams)):
                    if self._gauges.get(name) != value:
                        self._metrics[name].set(value)
                        self._gauges[name] = value
            except Exception:  # noqa: BLE001 - the next report counts what this one missed
                self._log(traceback.format_exc())


class ExpiryTimer:
    """A thread that sleeps until the session's earliest reorder deadline (or IDLE_CHECK_SECONDS), then expires
    what is due and reports. `wake()` when a record starts waiting: only that can bring the deadline forward."""

    def __init__(self, session: StreamSession, report: Callable[[], None], log: Callable[[str], None],
                 name: str = "risk_stream-expire"):
        self._session, self._report, self._log = session, report, log
        self._wake, self._stopping = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            # Cleared before the deadline is read: a record buffered after this point sets it again.
            self._wake.clear()
            try:
                fault_points.check("risk_stream.timer")
                deadline = self._session.expire()
                self._report()
            except Exception:  # noqa: BLE001 - the timer must outlive one bad round
                self._log(traceback.format_exc())
                deadline = None
            wait = IDLE_CHECK_SECONDS if deadline is None else (deadline - time.monotonic() * 1000.0) / 1000.0
            self._wake.wait(min(max(wait, 0.0), IDLE_CHECK_SECONDS))
