"""`s2t gateway`'s options and their defaults: the one place the command line, the library (`skill_gateway.serve`,
`CallLimits`, `AdmissionLimits`) and the deployments take them from. Pure data: the command line imports it at
start without loading gRPC."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The record decoder's limit on one record (backends/records/record_decoder.py DEFAULT_MAX_RECORD_BYTES).
RECORD_BYTES = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class GatewayOptions:
    port: int = 50051
    triton_url: str = "localhost:8001"
    model: str = "risk_pipeline"
    # Records scored together, as the legacy service did; at most the model's max_batch_size.
    window_size: int = 32
    # Call slots: legacy calls served at once.
    workers: int = 16
    # Slots one client connection may hold at once; None: all of `workers` (gRPC clients share one connection per
    # process and target, and one client process is often the only caller).
    max_calls_per_caller: int | None = None
    call_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0
    max_records: int = 10_000
    # Records over RECORD_BYTES but within this are answered INVALID_RECORD one by one; a larger message is refused
    # by gRPC as it arrives (RESOURCE_EXHAUSTED), before it is buffered whole.
    max_message_bytes: int = 4 * RECORD_BYTES
    mirror: str | None = None  # the legacy service's HOST:PORT: dual-run
    answer_from: str = "triton"
    diff_report: Path | None = None
    diff_report_interval_s: float = 10.0
    mirror_timeout_s: float = 5.0
    tolerance: float = 1e-5
    metrics_port: int = 0  # 0: no metrics endpoint
