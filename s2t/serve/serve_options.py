"""`s2t serve`'s options and their defaults: the one place the command line and the server's wiring take them from.
Pure data: the command line imports it at start."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Calls the gRPC front keeps in flight to tritonserver at most (s2t/serve/grpc_front.py takes it from here).
GRPC_FRONT_MAX_CALLS = 1024
# The gRPC front ends a call whose first message has not come this long after it began, and a stream with no message
# either way for this long (each would hold a call slot for nothing).
GRPC_FRONT_MESSAGE_SECONDS = 10
GRPC_FRONT_STREAM_IDLE_SECONDS = 60


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    repositories: tuple[Path, ...]
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    supervisor_port: int = 8003  # 0: no supervisor metrics
    model_control_mode: str = "poll"
    exit_timeout_s: int = 30
    rate_limit_slots: int | None = None
    max_restarts: int = 5
    openai_port: int = 0  # 0: no OpenAI-compatible API
    hang_seconds: float = 10.0  # an execute running longer makes the supervisor abort the server as hung
    grpc_max_calls: int = GRPC_FRONT_MAX_CALLS
    # The gRPC front in a process of its own (relays everything; its port stays open across a new tritonserver)
    # rather than inside tritonserver (ModelInfer through Triton's C API): s2t/serve/grpc_front.py.
    grpc_front_process: bool = False
    # The public HTTP port answered by the HTTP front inside tritonserver (inference through Triton's C API, checked
    # first; the rest relayed to Triton's own endpoint on loopback): s2t/serve/http_front.py. Off only to compare
    # with Triton's own HTTP front end on the public port.
    http_front: bool = True
    # Triton's latency summaries (nv_inference_*_summary_us, quantiles the p99 alert rule and dashboard panel read):
    # off by default, because Triton updates them on the model's own thread for every request, at a measured cost
    # (docs/observability.md, "Latency quantiles and what they cost").
    latency_summaries: bool = False
