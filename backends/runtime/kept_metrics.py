"""A python model's Prometheus metrics, made through `pb_utils.MetricFamily`: kept for the life of the process and
never deleted, and refusing before it is sent any update Triton would refuse (both kill a Triton 2.51 stub)."""
from __future__ import annotations

import ctypes
import threading
from typing import Callable

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# What Triton 2.51's server accepts of each kind of metric (core's metric_family.cc).
_ACCEPTS = {COUNTER: {"increment", "value"}, GAUGE: {"increment", "set", "value"}, HISTOGRAM: {"observe"}}


class MetricRefused(ValueError):
    """A metric update Triton would refuse, refused before it is sent."""


class KeptMetrics:
    """`pb_utils.MetricFamily` as a model's metric classes take it (called to make a family; COUNTER, GAUGE,
    HISTOGRAM): every family and metric made through it is kept for the life of the process and never deleted.

    Triton 2.51 cannot delete them safely either way. From the stub's teardown (the interpreter's last garbage
    collection, or the model object's end) the delete goes through the stub's state, already destroyed: the stub dies
    of a SIGSEGV at every unload. From a model's finalize it reaches the server, which shares one Prometheus metric
    among all families of a name and labels (the old and the new instance of a reloaded model) but counts references
    per family: the old instance's delete frees the metric the new one updates, and the server aborts on a corrupted
    heap. Kept, a replaced instance's series stay in the server's metrics with their last values (a new instance with
    the same labels counts on from them), and the server keeps its small objects for them until it exits."""

    def __init__(self, pb_utils):
        # Looked up when used: the stub sets pb_utils.MetricFamily only after model.py is imported.
        self._pb = pb_utils
        # One reference Python never gives back, so no teardown reaches the count of zero that deletes them.
        self._kept: list = []
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._kept))

    @property
    def COUNTER(self):  # noqa: N802 - MetricFamily's spelling
        return self._pb.MetricFamily.COUNTER

    @property
    def GAUGE(self):  # noqa: N802
        return self._pb.MetricFamily.GAUGE

    @property
    def HISTOGRAM(self):  # noqa: N802
        return self._pb.MetricFamily.HISTOGRAM

    def __call__(self, *args, **kwargs) -> "KeptFamily":
        kind = kwargs["kind"] if "kind" in kwargs else args[2]
        return KeptFamily(self.keep(self._pb.MetricFamily(*args, **kwargs)), self._kind_of(kind), self.keep)

    def keep(self, made):
        self._kept.append(made)
        return made

    def _kind_of(self, kind) -> str:
        family = self._pb.MetricFamily
        return {family.COUNTER: COUNTER, family.GAUGE: GAUGE, family.HISTOGRAM: HISTOGRAM}[kind]


class KeptFamily:
    """A MetricFamily made through KeptMetrics; the metrics it makes (Triton's own objects) are kept too, and
    handed out as CheckedMetrics."""

    __slots__ = ("_family", "_kind", "_keep")

    def __init__(self, family, kind: str, keep: Callable):
        self._family, self._kind, self._keep = family, kind, keep

    def Metric(self, *args, **kwargs) -> "CheckedMetric":  # noqa: N802 - the stub's spelling
        return CheckedMetric(self._keep(self._family.Metric(*args, **kwargs)), self._kind)


class CheckedMetric:
    """A Triton metric that refuses here, with MetricRefused, any update the server would refuse: an increment of
    a counter below zero (or NaN, which would stay in the counter), a set or observe the kind does not take.

    In Triton 2.51's python backend a refused update kills the stub: the server frees the error message it
    answers with as soon as the stub has woken, while the stub reads and frees it too. The double free corrupts the
    shared-memory pool, and one of the stub's next allocations dies of a SIGSEGV holding the pool's lock, on which
    the server then aborts (boost::interprocess::lock_exception).

    One thread at a time per metric: the stub's increment and observe let go of the GIL while they rewrite the
    metric's own copy in shared memory, so two threads updating one metric at once could free that copy twice."""

    __slots__ = ("_metric", "_kind", "_lock")

    def __init__(self, metric, kind: str):
        self._metric, self._kind = metric, kind
        self._lock = threading.Lock()

    def _check(self, operation: str) -> None:
        if operation not in _ACCEPTS[self._kind]:
            raise MetricRefused(f"a {self._kind} does not take {operation}")

    def increment(self, value) -> None:
        self._check("increment")
        if self._kind == COUNTER and not value >= 0:
            raise MetricRefused(f"a counter is incremented by a value of 0 or more, not {value}")
        with self._lock:
            self._metric.increment(value)

    def set(self, value) -> None:
        self._check("set")
        with self._lock:
            self._metric.set(value)

    def observe(self, value) -> None:
        self._check("observe")
        with self._lock:
            self._metric.observe(value)

    def value(self) -> float:
        self._check("value")
        with self._lock:
            return self._metric.value()
