"""Dual-run for a cutover: every window the gateway scores also goes to the other service, and the answers are
compared record by record.

The caller is answered by one side (`answered_by`: Triton, or the legacy service during the first phase of a
cutover); the other side is the mirror. A mirrored window runs in the background on a small pool with its own
timeout, at most `max_pending` windows at once: the caller never waits for the mirror, and a slow or dead mirror is
counted (`mirror_failures`), never retried or waited for. The tally keeps what a cutover is judged by (how many
records were compared, the largest probability difference, decision flips, records over tolerance, errors on one
side only, each with request ids) and is written as JSON every few seconds and when the gateway stops.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import grpc

from s2t.atomic_files import write_atomically
from s2t.wire import skill_pb2
from s2t.wire.skill_call import CallRefused

TRITON, LEGACY = "triton", "legacy"
DEFAULT_TOLERANCE = 1e-5
# Enough request ids to find the records again; the counts say how many there were in all.
MAX_IDS_KEPT = 100
_LOG = logging.getLogger(__name__)

WindowScorer = Callable[[Sequence[bytes], int], list]


class LegacyWindows:
    """A window of records (the raw bytes the caller sent) -> the legacy service's SkillResult per record (one Score
    call per window, the records sent on as they came)."""

    def __init__(self, target: str, timeout_s: float):
        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target)
        self._score = self._channel.stream_unary("/skill.Skill/Score", request_serializer=None,
                                                 response_deserializer=skill_pb2.SkillBatchResult.FromString)

    def __call__(self, window: Sequence[bytes], number: int) -> list[skill_pb2.SkillResult]:
        try:
            reply = self._score(iter(window), timeout=self.timeout_s)
        except grpc.RpcError as err:
            raise CallRefused(err.code(), f"legacy service at {self.target}: {err.details()}") from None
        if len(reply.results) != len(window):
            raise CallRefused(grpc.StatusCode.INTERNAL, f"legacy service at {self.target} answered "
                                                        f"{len(reply.results)} results for {len(window)} records")
        for result in reply.results:
            result.window = number
        return list(reply.results)

    def close(self) -> None:
        self._channel.close()


@dataclass
class _Ids:
    count: int = 0
    request_ids: list = field(default_factory=list)

    def add(self, request_id: str) -> None:
        self.count += 1
        if len(self.request_ids) < MAX_IDS_KEPT:
            self.request_ids.append(request_id)

    def as_dict(self) -> dict:
        return {"count": self.count, "request_ids": list(self.request_ids)}


@dataclass(frozen=True)
class WindowDiff:
    compared: int
    abs_diffs: tuple[float, ...]
    decision_flips: int
    over_tolerance: int
    triton_only_errors: int
    legacy_only_errors: int


class DiffTally:
    """Thread-safe running comparison of Triton's and the legacy service's answers."""

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE):
        self.tolerance = tolerance
        self._lock = threading.Lock()
        self.compared = 0
        self.both_scored = 0
        self.both_invalid = 0
        self.max_abs_diff = 0.0
        self._sum_abs_diff = 0.0
        self.decision_flips = _Ids()
        self.over_tolerance = _Ids()
        self.triton_only_errors = _Ids()
        self.legacy_only_errors = _Ids()
        self.mirror_failures = 0
        self.mirror_failed_records = 0
        self.mirror_failure_reasons: dict[str, int] = {}

    def compare(self, triton: Sequence[skill_pb2.SkillResult], legacy: Sequence[skill_pb2.SkillResult]) -> WindowDiff:
        diffs, flips, over, triton_only, legacy_only = [], 0, 0, 0, 0
        with self._lock:
            for t, leg in zip(triton, legacy):
                self.compared += 1
                t_ok, leg_ok = t.status == skill_pb2.OK, leg.status == skill_pb2.OK
                request_id = t.request_id or leg.request_id
                if t_ok and leg_ok:
                    diff = abs(float(t.probability) - float(leg.probability))
                    diffs.append(diff)
                    self.both_scored += 1
                    self._sum_abs_diff += diff
                    self.max_abs_diff = max(self.max_abs_diff, diff)
                    if diff > self.tolerance:
                        over += 1
                        self.over_tolerance.add(request_id)
                    if t.decision != leg.decision:
                        flips += 1
                        self.decision_flips.add(request_id)
                elif t_ok:
                    legacy_only += 1
                    self.legacy_only_errors.add(request_id)
                elif leg_ok:
                    triton_only += 1
                    self.triton_only_errors.add(request_id)
                else:
                    self.both_invalid += 1
        return WindowDiff(min(len(triton), len(legacy)), tuple(diffs), flips, over, triton_only, legacy_only)

    def mirror_failed(self, reason: str, records: int) -> None:
        with self._lock:
            self.mirror_failures += 1
            self.mirror_failed_records += records
            self.mirror_failure_reasons[reason] = self.mirror_failure_reasons.get(reason, 0) + 1

    def report(self) -> dict:
        with self._lock:
            return {
                "compared": self.compared,
                "both_scored": self.both_scored,
                "both_invalid": self.both_invalid,
                "tolerance": self.tolerance,
                "max_abs_diff": self.max_abs_diff,
                "mean_abs_diff": self._sum_abs_diff / self.both_scored if self.both_scored else 0.0,
                "decision_flips": self.decision_flips.as_dict(),
                "over_tolerance": self.over_tolerance.as_dict(),
                "errors_on_one_side": {TRITON: self.triton_only_errors.as_dict(),
                                       LEGACY: self.legacy_only_errors.as_dict()},
                "mirror_failures": self.mirror_failures,
                "mirror_failed_records": self.mirror_failed_records,
                "mirror_failure_reasons": dict(self.mirror_failure_reasons),
            }


class CutoverMetrics:
    """`s2t_cutover_*` on the gateway's metrics endpoint."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = registry or CollectorRegistry()
        self.compared = Counter("s2t_cutover_compared", "records answered by both services and compared",
                                registry=self.registry)
        self.abs_diff = Histogram("s2t_cutover_abs_diff", "|probability(triton) - probability(legacy)| per record",
                                  buckets=(1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0), registry=self.registry)
        self.max_abs_diff = Gauge("s2t_cutover_max_abs_diff", "largest probability difference so far",
                                  registry=self.registry)
        self.decision_flips = Counter("s2t_cutover_decision_flips", "records whose decision differs",
                                      registry=self.registry)
        self.over_tolerance = Counter("s2t_cutover_over_tolerance", "records whose probabilities differ by more "
                                      "than the tolerance", registry=self.registry)
        self.one_sided_errors = Counter("s2t_cutover_one_sided_errors", "records refused by one service only",
                                        ["refused_by"], registry=self.registry)
        self.mirror_failures = Counter("s2t_cutover_mirror_failures", "mirrored windows not compared",
                                       ["reason"], registry=self.registry)

    def record(self, diff: WindowDiff, max_abs_diff: float) -> None:
        self.compared.inc(diff.compared)
        for value in diff.abs_diffs:
            self.abs_diff.observe(value)
        self.max_abs_diff.set(max_abs_diff)
        self.decision_flips.inc(diff.decision_flips)
        self.over_tolerance.inc(diff.over_tolerance)
        self.one_sided_errors.labels(refused_by=TRITON).inc(diff.triton_only_errors)
        self.one_sided_errors.labels(refused_by=LEGACY).inc(diff.legacy_only_errors)


def write_json_atomically(path: Path, content: dict) -> None:
    write_atomically(path, json.dumps(content, indent=2) + "\n")


class DualRun:
    """The gateway's `mirror`: `submit` hands a scored window over and returns at once."""

    def __init__(self, mirror: WindowScorer, answered_by: str, mirror_name: str, tally: DiffTally | None = None,
                 metrics: CutoverMetrics | None = None, report_path: Path | None = None,
                 report_interval_s: float = 10.0, max_pending: int = 64, threads: int = 4):
        if answered_by not in (TRITON, LEGACY):
            raise ValueError(f"answered_by must be {TRITON} or {LEGACY}, got {answered_by!r}")
        self.mirror = mirror
        self.answered_by = answered_by
        self.mirror_name = mirror_name
        self.tally = tally or DiffTally()
        self.metrics = metrics
        self.report_path = report_path
        self._slots = threading.BoundedSemaphore(max_pending)
        self._pool = futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mirror")
        self._started = time.time()
        self._stop = threading.Event()
        self._writer = None
        if report_path is not None:
            self._writer = threading.Thread(target=self._write_every, args=(report_interval_s,),
                                            name="diff-report", daemon=True)
            self._writer.start()

    def submit(self, window: Sequence[bytes], number: int, answered: Sequence) -> None:
        if not self._slots.acquire(blocking=False):
            self._failed("BACKLOG", len(window))
            return
        try:
            self._pool.submit(self._mirror_window, list(window), number, list(answered))
        except RuntimeError:  # the pool is shutting down with the gateway
            self._slots.release()
            self._failed("STOPPING", len(window))

    def _mirror_window(self, window, number, answered) -> None:
        try:
            mirrored = self.mirror(window, number)
        except CallRefused as refused:
            self._failed(refused.code.name, len(window))
            return
        except Exception:  # noqa: BLE001 - the mirror must never take the gateway down; the log says why
            _LOG.exception("mirrored window %d failed", number)
            self._failed("ERROR", len(window))
            return
        finally:
            self._slots.release()
        triton, legacy = (answered, mirrored) if self.answered_by == TRITON else (mirrored, answered)
        diff = self.tally.compare(triton, legacy)
        if self.metrics is not None:
            self.metrics.record(diff, self.tally.max_abs_diff)

    def _failed(self, reason: str, records: int) -> None:
        self.tally.mirror_failed(reason, records)
        if self.metrics is not None:
            self.metrics.mirror_failures.labels(reason=reason).inc()

    def report(self) -> dict:
        return {"answered_by": self.answered_by, "mirror": self.mirror_name,
                "started_at": _iso(self._started), "updated_at": _iso(time.time()), **self.tally.report()}

    def _write_every(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self._write()

    def _write(self) -> None:
        try:
            write_json_atomically(self.report_path, self.report())
        except OSError:
            _LOG.exception("cannot write the diff report to %s", self.report_path)

    def close(self) -> dict:
        """Waits for the windows being mirrored (each bounded by its timeout), then writes the last report."""
        self._pool.shutdown(wait=True)
        close = getattr(self.mirror, "close", None)  # the mirror's per-thread channels and loops (BlockingWindows)
        if close is not None:
            close()
        self._stop.set()
        if self._writer is not None:
            self._writer.join()
            self._write()
        return self.report()


def _iso(epoch_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def dual_run_sides(triton_url: str, model: str, mirror_target: str, answer_from: str, call_timeout_s: float,
                   mirror_timeout_s: float, window_size: int, **dual_run_options):
    """(what answers the caller, the DualRun mirroring the other side) for `s2t gateway --mirror`. None as the
    answer means the gateway's own Triton scorer."""
    from s2t.gateway.skill_gateway import BlockingWindows, TritonWindows, in_thread
    if answer_from == TRITON:
        return None, DualRun(LegacyWindows(mirror_target, mirror_timeout_s), TRITON, mirror_target,
                             **dual_run_options)

    def triton_windows():
        from s2t.gateway.triton_infer import TritonInfer
        return TritonWindows(TritonInfer(triton_url, model, timeout_s=mirror_timeout_s), window_size)
    return (in_thread(LegacyWindows(mirror_target, call_timeout_s)),
            DualRun(BlockingWindows(triton_windows), LEGACY, triton_url, **dual_run_options))
