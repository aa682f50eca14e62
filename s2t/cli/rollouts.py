"""What the commands that change what is served share: the repository, its consumers, the server to wait for, and
how a rollout's timings are shown."""
from __future__ import annotations

from pathlib import Path

import click

from s2t.cli.options import DEFAULT_REPOSITORIES, http_url_option

repository_option = click.option("--repository", type=click.Path(file_okay=False, path_type=Path),
                                 default=DEFAULT_REPOSITORIES[0], show_default=True,
                                 help="the model repository that holds MODEL's version folders")
consumers_option = click.option(
    "--consumer-repository", "consumer_repositories", multiple=True, type=click.Path(file_okay=False, path_type=Path),
    help="repositories whose models serve MODEL's primary (risk_pipeline) [default: ./ensembles beside --repository]")
URL_HELP = "Triton's HTTP endpoint: wait until it runs the change (explicit mode: load it, with S2T_ADMIN_KEY)"
url_option = http_url_option(URL_HELP)


def rollout_of(model: str, repository: Path, consumer_repositories: tuple[Path, ...], url: str | None):
    from s2t.control.rollout import Rollout, default_consumer_repositories
    return Rollout(model, repository, tuple(consumer_repositories) or default_consumer_repositories(repository), url)


def report_timings(rollout) -> None:
    if rollout.timings:
        click.echo(f"{rollout.url}: in force after {rollout.timings['in force'] * 1000:.0f} ms ("
                   + ", ".join(f"{name} {seconds * 1000:.0f} ms" for name, seconds in rollout.timings.items()
                               if name != "in force") + ")", err=True)


def timings_ms(rollout) -> dict[str, float]:
    return {name: round(seconds * 1000, 1) for name, seconds in rollout.timings.items()}
