"""`s2t legacy`: the reference legacy TensorFlow model, built and served as the legacy platform did."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from s2t.cli.options import DEFAULT_DATA, DEFAULT_SAVED_MODEL, log_to_stderr
from s2t.serve.shutdown import exit_after_shutdown, stop_grpc_service, stop_on_signals, wait_for_stop


@click.group()
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
    from s2t.models import dataset, legacy_model
    report = legacy_model.build(dataset.fetch_german_credit(data_csv), out, lite)
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
    from s2t.legacy.service import LEGACY_THREADS, LegacyLimits, serve as serve_legacy
    from s2t.triton_config import decision_thresholds
    stop = stop_on_signals()
    limits = LegacyLimits(call_timeout_s=call_timeout_s, max_calls=max_calls, max_message_bytes=max_message_bytes)
    server = serve_legacy(port, saved_model, decision_thresholds(decision_config), window_size, limits=limits)
    click.echo(f"listening: legacy Skill service on port {port} (TensorFlow, {saved_model}, windows of "
               f"{window_size}, {LEGACY_THREADS} threads)")
    sys.stdout.flush()
    wait_for_stop(stop)
    stop_grpc_service(server, log_to_stderr)
    exit_after_shutdown()


COMMANDS = (legacy,)
