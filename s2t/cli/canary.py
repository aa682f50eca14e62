"""`s2t canary`: a share of traffic (or a mirror of it) to a staged version, by hand or by automated analysis."""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import click

from s2t.cli.options import emit, json_option
from s2t.cli.rollouts import consumers_option, report_timings, repository_option, rollout_of, timings_ms, url_option
from s2t.control.reachability import require_reachable
from s2t.errors import GATE_REFUSED
from s2t.gate.canary_limits import Limits


@click.command()
@click.argument("model")
@click.argument("version", type=int, required=False)
@click.option("--percent", type=float, help="share of traffic (0-100) the candidate answers, or mirrors with --shadow")
@click.option("--shadow", is_flag=True, help="mirror the share to the candidate; answers stay the primary's")
@click.option("--off", is_flag=True, help="send everything to the primary again (the candidate stays staged)")
@repository_option
@consumers_option
@click.option("--candidate-repository", "candidate_repositories", multiple=True,
              type=click.Path(file_okay=False, path_type=Path), default=(Path("model_repository_gpu"),),
              show_default=True, help="other repositories the candidate may live in (the GPU scorers)")
@url_option
@click.option("--auto", is_flag=True, help="automated analysis: a shadow step, then the --steps shares while the "
                                           "candidate stays within the limits; promote at the end, roll back on a breach")
@click.option("--steps", default="10,25,50,100", show_default=True, help="--auto: canary shares, in percent")
@click.option("--interval", default="60s", show_default=True, help="--auto: how long each step is watched")
@click.option("--metrics-url", help="--auto: risk_router's metrics [default: the --http-url host, port + 2]")
@click.option("--max-shadow-diff", type=float, default=Limits.max_shadow_mean_diff, show_default=True,
              help="--auto: mean |candidate - primary| on mirrored records")
@click.option("--max-error-rate", type=float, default=Limits.max_error_rate, show_default=True,
              help="--auto: share of the candidate's records that may fail")
@click.option("--max-p99-ms", type=float, default=Limits.max_p99_seconds * 1000, show_default=True,
              help="--auto: the candidate's scoring calls")
@click.option("--max-psi", type=float, default=Limits.max_psi, show_default=True,
              help="--auto: PSI of the candidate's scores against the primary's")
@click.option("--min-rows", type=click.IntRange(1), default=Limits.min_rows, show_default=True,
              help="--auto: candidate records a step needs before it is judged")
@json_option
def canary(model, version, percent, shadow, off, repository, consumer_repositories, candidate_repositories,
           url, auto, steps, interval, metrics_url, max_shadow_diff, max_error_rate, max_p99_ms, max_psi,
           min_rows, as_json) -> None:
    """MODEL's router (risk_router; llm_router for llm) sends PERCENT% of requests to MODEL VERSION (or mirrors
    records, scorers only), the rest to the primary; prints the split in force. With --auto: prints each step's
    figures, then `promoted N` or `rolled back (why)`."""
    from s2t.control.rollout import canary as run_canary
    if auto:
        return _auto_canary(model, version, repository, consumer_repositories, url, steps, interval, metrics_url,
                            max_shadow_diff, max_error_rate, max_p99_ms, max_psi, min_rows, as_json)
    if off == (percent is not None):
        raise click.UsageError("give either --percent P (with MODEL VERSION) or --off")
    if not off and version is None:
        raise click.UsageError("name the candidate's VERSION")
    require_reachable(url)
    rollout = rollout_of(model, repository, consumer_repositories, url)
    settings = run_canary(rollout, None if off else version, 0.0 if off or shadow else percent,
                          percent if shadow else 0.0, tuple(candidate_repositories))
    report_timings(rollout)
    emit(as_json, {"model": model, "primary": str(settings.primary),
                   "candidate": str(settings.candidate) if settings.candidate else None,
                   "canary_percent": settings.canary_percent, "shadow_percent": settings.shadow_percent,
                   "split": settings.describe(), "timings_ms": timings_ms(rollout)}, settings.describe())


def _auto_canary(model, version, repository, consumer_repositories, url, steps, interval, metrics_url,
                 max_shadow_diff, max_error_rate, max_p99_ms, max_psi, min_rows, as_json) -> None:
    from s2t.control import auto_canary
    from s2t.control.status import default_metrics_url
    from s2t.gate import canary_analysis
    if version is None or not url:
        raise click.UsageError("--auto needs MODEL VERSION and --http-url")
    try:
        shares = sorted(float(s) for s in steps.split(","))
        interval_seconds = canary_analysis.parse_duration(interval)
    except ValueError as err:
        raise click.UsageError(f"--steps / --interval: {err}") from None
    if not shares or not all(0 < s <= 100 for s in shares):
        raise click.UsageError("--steps: shares within 0..100, e.g. 10,25,50,100")
    limits = Limits(max_shadow_mean_diff=max_shadow_diff, max_error_rate=max_error_rate,
                    max_p99_seconds=max_p99_ms / 1000, max_psi=max_psi, min_rows=min_rows)
    require_reachable(url)
    rollout = rollout_of(model, repository, consumer_repositories, url)
    outcome = auto_canary.run(rollout, version, shares, interval_seconds, limits,
                              metrics_url or default_metrics_url(url), log=lambda line: click.echo(line, err=as_json))
    emit(as_json, {"model": model, "version": version, "promoted": outcome.promoted,
                   "reason": outcome.reason, "steps": [asdict(step) for step in outcome.steps]},
         outcome.line(version))
    if not outcome.promoted:
        sys.exit(GATE_REFUSED)


COMMANDS = (canary,)
