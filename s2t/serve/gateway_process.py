"""`s2t gateway`: the legacy Skill gRPC service in front of Triton, alone or dual-running against the legacy service.

Wires the gateway (s2t/gateway/skill_gateway.py), the dual-run sides and their metrics endpoint together; the command
line only parses options and waits for the stop signal."""
from __future__ import annotations

from typing import Callable

from s2t.gateway.gateway_options import GatewayOptions
from s2t.serve.shutdown import stop_grpc_service

__all__ = ["GatewayOptions", "RunningGateway"]


class RunningGateway:
    def __init__(self, options: GatewayOptions):
        from s2t.gateway.skill_gateway import CallLimits, serve as serve_gateway
        o = options
        answer = self.dual_run = None
        limits = CallLimits(timeout_s=o.call_timeout_s, max_records=o.max_records, max_message_bytes=o.max_message_bytes)
        if o.mirror:
            from s2t.gateway.dual_run import CutoverMetrics, DiffTally, dual_run_sides
            metrics = CutoverMetrics()
            answer, self.dual_run = dual_run_sides(o.triton_url, o.model, o.mirror, o.answer_from, o.call_timeout_s,
                                                   o.mirror_timeout_s, o.window_size, tally=DiffTally(o.tolerance),
                                                   metrics=metrics, report_path=o.diff_report,
                                                   report_interval_s=o.diff_report_interval_s)
            if o.metrics_port:
                from prometheus_client import start_http_server
                start_http_server(o.metrics_port, registry=metrics.registry)
        self.server = serve_gateway(o.port, o.triton_url, o.model, o.window_size, o.workers, limits=limits,
                                    answer=answer, mirror=self.dual_run, calls_per_caller=o.max_calls_per_caller,
                                    idle_timeout_s=o.idle_timeout_s)
        dual = f"; dual-run with {o.mirror}, answers from {o.answer_from}" if o.mirror else ""
        self.ready_line = (f"ready: legacy Skill service on port {o.port} -> {o.model} at {o.triton_url} "
                           f"(windows of {o.window_size}{dual})")

    def stop(self, log: Callable[[str], None]) -> None:
        stop_grpc_service(self.server, log)
        if self.dual_run is not None:
            report = self.dual_run.close()
            log(f"dual-run: {report['compared']} compared, max |diff| {report['max_abs_diff']:.3g}, "
                f"{report['decision_flips']['count']} decision flips, {report['mirror_failures']} mirror failures")
