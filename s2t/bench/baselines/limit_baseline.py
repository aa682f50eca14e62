"""Baseline 2, the limit: the same ONNX file in this process with ONNX Runtime (one intra-op thread), at the same
batch sizes, with no server, no IPC and no wire format; and the same plus decoding the JSON records and the
decision, the least any server doing the pipeline's work could spend."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from s2t.backends.scoring.decision_policy import Thresholds, decide
from s2t.backends.records.record_decoder import RecordDecoder
from s2t.bench.harness.latency import LatencySummary


@dataclass(frozen=True)
class InProcessPoint:
    what: str  # "onnxruntime" (packed tensors) or "decode+onnxruntime+decide" (JSON records)
    batch: int
    calls: int
    rows_per_s: float
    p50_ms: float
    p99_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def session(model: Path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def time_calls(batch: int, seconds: float, call, warmup: int = 20) -> tuple[int, float, float, float]:
    """Call `call(i)` for `seconds` after `warmup` calls: (calls, rows/s, p50 ms, p99 ms) at `batch` rows a call."""
    for i in range(warmup):
        call(i)
    durations = []
    started = time.perf_counter()
    i = 0
    while time.perf_counter() - started < seconds:
        t = time.perf_counter()
        call(i)
        durations.append(time.perf_counter() - t)
        i += 1
    elapsed = time.perf_counter() - started
    latency = LatencySummary.of_seconds(durations)
    return latency.calls, latency.calls * batch / elapsed, latency.p50_ms, latency.p99_ms


def _timed(what: str, batch: int, seconds: float, call) -> InProcessPoint:
    return InProcessPoint(what, batch, *time_calls(batch, seconds, call))


def measure(model: Path, categorical: np.ndarray, numeric: np.ndarray, payloads: list[bytes], decoder: RecordDecoder,
            thresholds: Thresholds, batches: list[int], seconds: float) -> list[InProcessPoint]:
    sess = session(model)
    n = len(categorical)
    points = []
    for batch in batches:
        starts = [(k * batch) % max(1, n - batch + 1) for k in range(64)]

        def engine(i, batch=batch, starts=starts):
            s = starts[i % len(starts)]
            sess.run(None, {"categorical": categorical[s:s + batch], "numeric": numeric[s:s + batch]})

        def pipeline(i, batch=batch, starts=starts):
            s = starts[i % len(starts)]
            decoded = decoder.decode(payloads[s:s + batch])
            (p,) = sess.run(None, {"categorical": decoded.categorical, "numeric": decoded.numeric})
            decide(p, thresholds)

        points.append(_timed("onnxruntime", batch, seconds, engine))
        points.append(_timed("decode+onnxruntime+decide", batch, seconds, pipeline))
    return points
