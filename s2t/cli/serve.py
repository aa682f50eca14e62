"""Commands that serve: the embedded tritonserver and the legacy Skill gateway in front of it."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from s2t.cli.options import DEFAULT_REPOSITORIES, LLM_REPOSITORY, grpc_url_option, log_to_stderr, repositories_option
from s2t.gateway.gateway_options import GatewayOptions
from s2t.serve.serve_options import ServeOptions
from s2t.serve.shutdown import exit_after_shutdown, stop_on_signals, wait_for_stop


def envvars(name: str) -> list[str]:
    """`S2T_NAME`, then `NAME` (the older spelling, still read)."""
    return [f"S2T_{name}", name]


@click.command()
@click.option("--http-port", type=int, envvar=envvars("HTTP_PORT"), default=ServeOptions.http_port, show_default=True,
              help="Triton's HTTP port")
@click.option("--grpc-port", type=int, envvar=envvars("GRPC_PORT"), default=ServeOptions.grpc_port, show_default=True,
              help="the gRPC port: the gRPC front, with tritonserver's own endpoint on loopback behind it")
@click.option("--metrics-port", type=int, envvar=envvars("METRICS_PORT"), default=ServeOptions.metrics_port, show_default=True,
              help="Triton's Prometheus metrics port")
@click.option("--supervisor-port", type=int, envvar=envvars("SUPERVISOR_PORT"),
              default=ServeOptions.supervisor_port, show_default=True,
              help="Prometheus metrics of the supervisor (reloads, server restarts); 0: none")
@click.option("--model-control-mode", type=click.Choice(["poll", "explicit"]),
              default=ServeOptions.model_control_mode, show_default=True,
              help="poll: version folders swap in live; explicit: loads only on request (needs S2T_ADMIN_KEY)")
@repositories_option(contract_spelling="--model-repository")
@click.option("--exit-timeout", type=int, default=ServeOptions.exit_timeout_s, show_default=True,
              help="seconds Triton waits for in-flight requests on SIGINT/SIGTERM")
@click.option("--rate-limit", "rate_limit", type=int, envvar="S2T_RATE_LIMIT",
              help="Triton's rate limiter: at most N model executions at once (off by default)")
@click.option("--max-restarts", type=int, default=ServeOptions.max_restarts, show_default=True,
              help="tritonserver is started again after it dies, at most this often within 10 minutes")
@click.option("--hang-seconds", type=float, default=ServeOptions.hang_seconds, show_default=True,
              help="an execute of the in-process backend running this long means a hung server: it is aborted "
                   "(its Python stacks to the log) and started again")
@click.option("--grpc-max-calls", type=click.IntRange(min=1), envvar="S2T_GRPC_MAX_CALLS",
              default=ServeOptions.grpc_max_calls, show_default=True,
              help="calls the gRPC front has in flight to tritonserver at most, answered or abandoned by their "
                   "callers; past it a new call is refused UNAVAILABLE at once")
@click.option("--grpc-front-process", is_flag=True, envvar="S2T_GRPC_FRONT_PROCESS",
              default=ServeOptions.grpc_front_process,
              help="run the gRPC front in a process of its own, which relays every call to Triton's gRPC endpoint "
                   "and keeps the gRPC port open while a new tritonserver starts; by default it runs inside "
                   "tritonserver and answers ModelInfer through Triton's C API, at about half the CPU per call")
@click.option("--no-http-front", "no_http_front", is_flag=True, envvar="S2T_NO_HTTP_FRONT",
              default=not ServeOptions.http_front,
              help="serve the HTTP port with Triton's own HTTP front end, as a comparison; by default the HTTP front "
                   "inside tritonserver answers it, which refuses requests that crash Triton 2.51 and relays the "
                   "rest to Triton's own endpoint on loopback")
@click.option("--latency-summaries", is_flag=True, envvar="S2T_LATENCY_SUMMARIES",
              default=ServeOptions.latency_summaries,
              help="Triton's latency quantiles (nv_inference_*_summary_us: p50 and p99, which the p99 alert rule and "
                   "dashboard panel read); off by default: Triton updates them for every request on the model's "
                   "thread, which costs the hot path about a fifth of its requests per second")
@click.option("--llm", "with_llm", is_flag=True,
              help=f"also serve {LLM_REPOSITORY}/ (llm, llm_router, risk_explainer)")
@click.option("--openai-port", type=int, envvar=envvars("OPENAI_PORT"), default=9000, show_default=True,
              help="with --llm: the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models), "
                   "answering before `ready:` is printed; 0: none")
def serve(http_port, grpc_port, metrics_port, supervisor_port, model_control_mode, repositories, exit_timeout,
          rate_limit, max_restarts, hang_seconds, grpc_max_calls, grpc_front_process, no_http_front,
          latency_summaries, with_llm, openai_port) -> None:
    """Run the embedded tritonserver until SIGINT/SIGTERM, then drain in-flight requests.

    Supervised: a model whose stub died or that fails over 10% of its requests for 5 s (its own failures, never
    a caller's errors) is reloaded, and reported when reloads do not heal it; a dead or hung tritonserver is
    started again (with backoff); its stubs never outlive it. What was done is in supervisor.json in the
    repository's control area and on --supervisor-port."""
    from s2t.serve.foreground import serve as run_serve
    served = (*(repositories or DEFAULT_REPOSITORIES), *([LLM_REPOSITORY] if with_llm else []))
    options = ServeOptions(repositories=served, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                           supervisor_port=supervisor_port, model_control_mode=model_control_mode,
                           exit_timeout_s=exit_timeout, rate_limit_slots=rate_limit, max_restarts=max_restarts,
                           openai_port=openai_port if with_llm else 0, hang_seconds=hang_seconds,
                           grpc_max_calls=grpc_max_calls, grpc_front_process=grpc_front_process,
                           http_front=not no_http_front, latency_summaries=latency_summaries)
    sys.exit(run_serve(options, os.environ, log_to_stderr))


@click.command()
@click.option("--port", type=int, envvar=envvars("GATEWAY_PORT"), default=GatewayOptions.port, show_default=True,
              help="where legacy Skill callers connect")
@grpc_url_option("Triton's gRPC endpoint", name="triton_url", contract_spelling="--triton-url",
                 default=GatewayOptions.triton_url, show_default=True)
@click.option("--model", default=GatewayOptions.model, show_default=True,
              help="the Triton model the records go to")
@click.option("--window-size", type=int, default=GatewayOptions.window_size, show_default=True,
              help="records scored together, as the legacy did; at most the model's max_batch_size")
@click.option("--workers", type=int, default=GatewayOptions.workers, show_default=True,
              help="call slots: legacy calls served at once; when all are taken, a call silent for 0.5 s gives "
                   "its slot to a new call, else the new call is refused RESOURCE_EXHAUSTED at once")
@click.option("--max-calls-per-caller", type=int, default=GatewayOptions.max_calls_per_caller,
              help="call slots one client connection may hold at once (gRPC clients share one connection per "
                   "process and target); default: --workers")
@click.option("--call-timeout-s", type=float, default=GatewayOptions.call_timeout_s, show_default=True,
              help="longest a call may last, idle or not (DEADLINE_EXCEEDED after)")
@click.option("--idle-timeout-s", type=float, default=GatewayOptions.idle_timeout_s, show_default=True,
              help="longest a call may go without sending a record (DEADLINE_EXCEEDED after)")
@click.option("--max-records", type=int, default=GatewayOptions.max_records, show_default=True,
              help="records one call may carry (INVALID_ARGUMENT past it)")
@click.option("--max-message-bytes", type=int, default=GatewayOptions.max_message_bytes, show_default=True,
              help="largest message accepted; a record over 64 KiB but within this is answered INVALID_RECORD, "
                   "a larger one fails its call RESOURCE_EXHAUSTED before it is buffered")
@click.option("--mirror", metavar="HOST:PORT", help="dual-run: also send every window to the legacy service here")
@click.option("--answer-from", type=click.Choice(["triton", "legacy"]), default=GatewayOptions.answer_from, show_default=True,
              help="with --mirror: the service whose answers the callers get")
@click.option("--diff-report", type=click.Path(dir_okay=False, path_type=Path),
              help="with --mirror: JSON comparison written every --diff-report-interval-s and at exit")
@click.option("--diff-report-interval-s", type=float, default=GatewayOptions.diff_report_interval_s, show_default=True,
              help="with --diff-report: seconds between writes")
@click.option("--mirror-timeout-s", type=float, default=GatewayOptions.mirror_timeout_s, show_default=True,
              help="longest a mirrored window is waited for in the background (callers never wait for it)")
@click.option("--tolerance", type=float, default=GatewayOptions.tolerance, show_default=True,
              help="probability difference counted over tolerance")
@click.option("--metrics-port", type=int, default=GatewayOptions.metrics_port, show_default=True,
              help="Prometheus metrics (s2t_cutover_*) on this port; 0: none")
def gateway(port, triton_url, model, window_size, workers, max_calls_per_caller, call_timeout_s, idle_timeout_s,
            max_records, max_message_bytes, mirror, answer_from, diff_report, diff_report_interval_s, mirror_timeout_s,
            tolerance, metrics_port) -> None:
    """Serve the legacy Skill gRPC service (s2t/wire/skill.proto), forwarding to Triton, until SIGINT/SIGTERM."""
    from s2t.serve.gateway_process import RunningGateway
    if (answer_from != "triton" or diff_report) and not mirror:
        raise click.UsageError("--answer-from and --diff-report need --mirror HOST:PORT")
    if workers < 1 or max_calls_per_caller is not None and not 1 <= max_calls_per_caller <= workers:
        raise click.UsageError(f"need --workers >= 1 and --max-calls-per-caller between 1 and --workers ({workers}), "
                               f"got {max_calls_per_caller}")
    gateway = RunningGateway(GatewayOptions(
        port=port, triton_url=triton_url, model=model, window_size=window_size, workers=workers,
        max_calls_per_caller=max_calls_per_caller, call_timeout_s=call_timeout_s, idle_timeout_s=idle_timeout_s,
        max_records=max_records, max_message_bytes=max_message_bytes, mirror=mirror, answer_from=answer_from,
        diff_report=diff_report, diff_report_interval_s=diff_report_interval_s, mirror_timeout_s=mirror_timeout_s,
        tolerance=tolerance, metrics_port=metrics_port))
    stop = stop_on_signals()
    log_to_stderr(gateway.ready_line)
    wait_for_stop(stop)
    gateway.stop(log_to_stderr)
    exit_after_shutdown()


COMMANDS = (serve, gateway)
