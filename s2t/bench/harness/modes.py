"""How much each mode measures. `quick` fits in under 3 minutes on the 2-core machine; `smoke` only proves the
machinery (the tests run it); `full` is what the README table comes from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    window_requests: int  # perf_analyzer: answered requests per measurement window
    concurrency: tuple[int, ...]  # closed-loop sweep, batch 1, both models and protocols
    batches: tuple[int, ...]  # client-side batches over gRPC (concurrency 2), and in-process
    request_rates: tuple[int, ...]  # open-loop points on risk_pipeline
    rate_protocols: tuple[str, ...]
    http_seconds: int  # wrk: Triton and the FastAPI baseline, each
    swap_seconds: int
    swaps: int
    stream_records: int
    stream_streams: int
    inprocess_seconds: float
    cold_starts: int
    http_connections: int = 16
    # wrk rounds: Triton and each FastAPI app take turns (http_seconds each per round) while all are up, so a
    # change in the machine's load hits every side alike; each side's figure is its median round.
    http_rounds: int = 1
    # perf_analyzer HTTP / gRPC rounds on risk_pipeline at http_connections, alternating (s2t/bench/scenarios/protocols.py).
    protocol_rounds: int = 1


MODES = {
    "smoke": Mode("smoke", 100, (4,), (8,), (200,), ("http",), 2, 6, 1, 200, 4, 0.2, 1),
    "quick": Mode("quick", 600, (1, 16), (1, 256), (1000,), ("http",), 5, 12, 2, 2000, 16, 1.0, 1, http_rounds=2,
                  protocol_rounds=2),
    "full": Mode("full", 1500, (1, 4, 16, 32), (1, 16, 64, 256), (500, 1000, 2000), ("http", "grpc"),
                 8, 30, 5, 5000, 16, 3.0, 3, http_rounds=5, protocol_rounds=5),
}
