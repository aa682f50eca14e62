"""Commands that change or show what is served: promote, rollback, status, and the release a pod copies."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from s2t.cli.failures import about
from s2t.cli.options import DEFAULT_REPOSITORIES, emit, http_url_option, json_option, repositories_option
from s2t.cli.rollouts import (URL_HELP, consumers_option, report_timings, repository_option, rollout_of, timings_ms,
                              url_option)
from s2t.control.reachability import require_reachable


@click.command()
@click.argument("model")
@click.argument("version", type=int)
@repository_option
@consumers_option
@http_url_option(URL_HELP, contract_spelling="--url")
@json_option
def promote(model, version, repository, consumer_repositories, url, as_json) -> None:
    """VERSION becomes MODEL's primary on every path; the canary is cleared; the old primary stays loaded."""
    from s2t.control.rollout import promote as run_promote
    require_reachable(url)
    rollout = rollout_of(model, repository, consumer_repositories, url)
    run_promote(rollout, version)
    report_timings(rollout)
    click.echo(f"{model}: version {version} is the primary" + (f" at {url}" if url else ""), err=True)
    emit(as_json, {"model": model, "primary": version, "timings_ms": timings_ms(rollout)}, str(version))


@click.command()
@click.argument("model")
@click.option("--to", "to", type=int, help="the version to serve (default: abort the canary, else the previous one)")
@repository_option
@consumers_option
@url_option
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation")
@json_option
def rollback(model, to, repository, consumer_repositories, url, yes, as_json) -> None:
    """Abort MODEL's canary (candidate retired, primary untouched), or serve the previous (or given) version again.

    Prints the version now served."""
    from s2t.control.rollout import rollback as run_rollback, rollback_plan
    require_reachable(url)
    rollout = rollout_of(model, repository, consumer_repositories, url)
    planned = rollback_plan(rollout, to)
    if not yes and sys.stdin.isatty():
        click.confirm(planned.describe(model) + "?", abort=True)
    done = run_rollback(rollout, planned)  # what the operator confirmed, or nothing
    report_timings(rollout)
    click.echo(done.describe(model).replace(": abort", ": aborted").replace(": serve", ": serving"), err=True)
    emit(as_json, {"model": model, "action": done.action, "serving": done.target, "previous": done.primary,
                   "retired": list(done.retiring), "timings_ms": timings_ms(rollout)}, str(done.target))


@click.command()
@repository_option
@consumers_option
@http_url_option("Triton's HTTP endpoint: add what it has loaded", contract_spelling="--url")
@click.option("--metrics-url", help="risk_router's breaker state from here [default: the --http-url host, port + 2]")
@click.option("--history", "history_lines", type=click.IntRange(0), default=5, show_default=True,
              help="last history lines shown")
@json_option
def status(repository, consumer_repositories, url, metrics_url, history_lines, as_json) -> None:
    """Models, versions and their roles (primary, previous, candidate), the split, the breaker, supervisor restarts,
    the last history lines."""
    from s2t.control.status import collect, table
    with about(f"{url}: " if url else ""):
        report = collect(repository, tuple(consumer_repositories), url, metrics_url, history_lines)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else table(report))


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("build/releases"),
              show_default=True, help="the release goes to OUT/<id>/")
@repositories_option("a repository in the release (repeatable) [default: ./model_repository and ./ensembles]")
@click.option("--pin", "pin_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="also write the id into the manifests under this folder (e.g. deploy/kubernetes)")
def release(out_dir, repositories, pin_dir) -> None:
    """Assemble what a Kubernetes or KServe pod copies (repositories and every module the python models import),
    named by its content; the last line printed is its id. Upload OUT/<id>/ to the bucket as releases/<id>."""
    from s2t.control import release as releases
    release_id = releases.build(Path.cwd(), list(repositories or DEFAULT_REPOSITORIES), out_dir)
    for path in releases.pin(pin_dir, release_id) if pin_dir else []:
        click.echo(f"pinned {path}", err=True)
    click.echo(f"release in {out_dir / release_id}", err=True)
    click.echo(release_id)


COMMANDS = (promote, rollback, status, release)
