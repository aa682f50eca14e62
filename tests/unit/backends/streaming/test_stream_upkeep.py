"""risk_stream's metrics through the glue's metric families (tests/unit/python_backend.py): execute and the timer
both report, and what reaches Triton is the session's counts, applied in the order they were read."""
from __future__ import annotations

import threading

from s2t.backends.streaming.upkeep import COUNTERS, StreamMetrics
from s2t.backends.runtime.triton_glue import Glue
from tests.unit import python_backend as backend


class CountingSession:
    """Counts that grow by one at every read. The first read holds until `go` is set, so that a second reporter can
    try to read and report newer counts meanwhile."""

    def __init__(self):
        self.reads, self.delivery_failures = 0, 0
        self.first_read, self.go = threading.Event(), threading.Event()

    def snapshot(self):
        self.reads += 1
        read = self.reads
        if read == 1:
            self.first_read.set()
            self.go.wait(timeout=5)
        return {name: read for name in COUNTERS}, read, read


class FailingSession(CountingSession):
    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures

    def snapshot(self):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the session is busy")
        return super().snapshot()


def metrics(log=lambda text: None) -> StreamMetrics:
    return StreamMetrics(Glue(backend.backend_utils(), "risk_stream").metric_family, {"model": "risk_stream"}, log)


def values() -> dict[str, float]:
    return {name: family.metrics[0].value() for name, family in backend.MetricFamily.families.items()}


def test_a_report_that_read_older_counts_is_not_applied_after_a_newer_one():
    # The older counts applied last would be a counter incremented below zero: Triton 2.51 refuses it, and the
    # stub's shared memory is corrupted by the refusal.
    session, problems = CountingSession(), []
    stream_metrics = metrics(problems.append)

    def report():
        try:
            stream_metrics.report(session)
        except Exception as err:  # noqa: BLE001 - the test reports it
            problems.append(repr(err))

    older = threading.Thread(target=report)
    older.start()
    assert session.first_read.wait(timeout=5)
    newer = threading.Thread(target=report)
    newer.start()
    newer.join(timeout=0.3)
    session.go.set()
    older.join(timeout=5)
    newer.join(timeout=5)
    assert problems == []
    assert values() == {**{f"s2t_stream_{name}_total": 2 for name in COUNTERS}, "s2t_stream_buffered": 2,
                        "s2t_stream_streams": 2, "s2t_stream_delivery_failures_total": 0}


def test_counters_take_only_what_grew_since_the_last_report():
    stream_metrics, session = metrics(), CountingSession()
    session.go.set()
    session.delivery_failures = 3
    stream_metrics.report(session)
    stream_metrics.report(session)
    session.delivery_failures = 4
    stream_metrics.report(session)
    assert values()["s2t_stream_reordered_total"] == 3 and values()["s2t_stream_delivery_failures_total"] == 4


def test_a_report_that_fails_is_logged_not_raised_and_the_next_one_counts_what_it_missed():
    # A report from execute that raised would fail requests that are already answered or still waiting.
    logged = []
    stream_metrics, session = metrics(logged.append), FailingSession(failures=1)
    session.go.set()
    stream_metrics.report(session)
    assert len(logged) == 1 and "the session is busy" in logged[0]
    stream_metrics.report(session)
    stream_metrics.report(session)
    assert values()["s2t_stream_gap_total"] == 2 and values()["s2t_stream_buffered"] == 2


class SetCountingMetric(backend.Metric):
    def __init__(self, labels):
        super().__init__(labels)
        self.sets = 0

    def set(self, value):
        self.sets += 1
        super().set(value)


class SetCountingFamily(backend.MetricFamily):
    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the stub's spelling
        metric = SetCountingMetric(labels or {})
        self.metrics.append(metric)
        return metric


class SteadySession:
    delivery_failures = 0

    def __init__(self):
        self.buffered = 3

    def snapshot(self):
        return {name: 0 for name in COUNTERS}, self.buffered, 5


def test_a_gauge_that_has_not_moved_is_not_sent_again():
    # Every update is a round trip from the stub to the server, made by the execute that reports.
    glue = Glue(backend.backend_utils(), "risk_stream")
    glue.pb.MetricFamily = SetCountingFamily
    stream_metrics, session = StreamMetrics(glue.metric_family, {}), SteadySession()
    for buffered in (3, 3, 4, 4):
        session.buffered = buffered
        stream_metrics.report(session)
    gauges = {name: family.metrics[0] for name, family in SetCountingFamily.families.items()
              if name in ("s2t_stream_buffered", "s2t_stream_streams")}
    assert {name: (m.value(), m.sets) for name, m in gauges.items()} == {"s2t_stream_buffered": (4, 2),
                                                                         "s2t_stream_streams": (5, 1)}
