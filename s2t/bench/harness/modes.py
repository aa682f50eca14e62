"""How much each mode measures. `quick` fits in under 3 minutes on the 2-core machine (two rounds a line); `full`
takes about 12 minutes, five rounds a line with the FastAPI workers swept, and is what the README's figures come
from (it measures only the points the documents publish); `smoke` only proves the machinery (the tests run it)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Mode:
    name: str
    window_requests: int  # perf_analyzer: answered requests per measurement window
    concurrency: tuple[int, ...]  # closed-loop sweep, batch 1, both models and protocols
    batches: tuple[int, ...]  # client-side batches over gRPC (concurrency 2), and in-process
    request_rates: tuple[int, ...]  # open-loop points on risk_pipeline
    rate_protocols: tuple[str, ...]
    http_seconds: int  # wrk: Triton and the FastAPI baseline, each
    swaps: int  # publish + `s2t rollback` pairs under gRPC load (rollback_under_load.py)
    stream_records: int
    stream_streams: int
    inprocess_seconds: float
    cold_starts: int
    http_connections: int = 16
    # wrk rounds: Triton and each FastAPI side take turns (http_seconds each per round, the order rotating) while
    # all are up, so a change in the machine's load hits every side alike; each side's figure is its median round.
    http_rounds: int = 1
    # uvicorn workers of each FastAPI app, one side per count: each round's strongest side is its baseline, as
    # Triton runs its best settings.
    baseline_workers: tuple[int, ...] = (2,)
    # perf_analyzer HTTP / gRPC rounds on risk_pipeline at http_connections, alternating
    # (s2t/bench/scenarios/protocols.py).
    protocol_rounds: int = 1
    # perf_analyzer's time window in ms, in place of windows of `window_requests` (perf_analyzer.Settings).
    perf_window_ms: int | None = None
    # Latency at the same offered rate (load/open_loop.py): Triton and the plain FastAPI app at its strongest worker
    # count, fed the same schedule at these shares of that app's measured capacity, taking turns.
    open_loop_shares: tuple[float, ...] = (0.5, 0.8)
    open_loop_rounds: int = 1
    open_loop_seconds: float = 5.0


MODES = {
    "smoke": Mode(name="smoke", window_requests=100, concurrency=(4,), batches=(8,), request_rates=(200,),
                  rate_protocols=("http",), http_seconds=1, swaps=1, stream_records=200,
                  stream_streams=4, inprocess_seconds=0.2, cold_starts=1, perf_window_ms=300,
                  open_loop_seconds=1.0),
    "quick": Mode(name="quick", window_requests=600, concurrency=(1, 16), batches=(1, 256), request_rates=(1000,),
                  rate_protocols=("http",), http_seconds=5, swaps=5, stream_records=2000,
                  stream_streams=16, inprocess_seconds=1.0, cold_starts=1, http_rounds=2, protocol_rounds=2,
                  open_loop_seconds=4.0),
    "full": Mode(name="full", window_requests=1500, concurrency=(1, 16), batches=(1, 256),
                 request_rates=(1000,), rate_protocols=("http",), http_seconds=6,
                 swaps=5, stream_records=5000, stream_streams=16, inprocess_seconds=3.0, cold_starts=3, http_rounds=5,
                 protocol_rounds=5, baseline_workers=(1, 2, 4), open_loop_rounds=3, open_loop_seconds=6.0),
}
