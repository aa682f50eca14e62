"""Commands that watch a running service: drift of the live records, and soaks (plain or hostile)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from s2t.cli.failures import about
from s2t.cli.options import DEFAULT_DATA, DEFAULT_ONNX, DEFAULT_REPOSITORIES, http_url_option
from s2t.cli.progress import progress, step
from s2t.errors import GATE_REFUSED


@click.command()
@http_url_option("Triton's HTTP endpoint; its metrics are read on port + 2", contract_spelling="--url")
@click.option("--metrics-url", metavar="HOST:PORT",
              help="where risk_router's metrics are (HOST:PORT or a URL) [default: the --http-url host, port + 2]")
@click.option("--json", "as_json", is_flag=True,
              help="{reference, reference_version, window_records, sampled_records, features: {name: {psi, "
                   "noise_psi, sample, min_sample, state, top_bins}}}, for scripts")
@click.option("--build-reference", "reference_out", type=click.Path(dir_okay=False, path_type=Path),
              help="instead: write the training data's distributions (the reference risk_router compares with)")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="--build-reference: the training data")
@click.option("--onnx", "onnx_model", type=click.Path(path_type=Path), default=DEFAULT_ONNX, show_default=True,
              help="--build-reference: the model whose training scores are the score reference")
def drift(url, metrics_url, as_json, reference_out, data_csv, onnx_model) -> None:
    """PSI per feature and of the score over the last records routed, against the served version's reference:
    drift where PSI is over both its sampling-noise level and 0.2; the top moved bins of each drifted feature."""
    from s2t.control.status import default_metrics_url
    from s2t.gate import drift as feature_drift
    if reference_out:
        feature_drift.build_reference(data_csv, onnx_model, reference_out)
        click.echo(reference_out)
        return
    source = metrics_url or default_metrics_url(url)
    if not source:
        raise click.UsageError("give --http-url (or --metrics-url)")
    with about(f"cannot read {source}: "):
        report = feature_drift.live_report(source)
    click.echo(json.dumps(report, indent=2, sort_keys=True) if as_json else feature_drift.table(report))


@click.command()
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
              help="the JSON report: RSS samples, their fit projected to 72 hours, errors, verdicts")
@click.option("--hostile", is_flag=True,
              help="start `s2t serve --llm` and `s2t gateway`, send valid traffic on every path and, in the middle "
                   "half of the run, every flood; a verdict per reliability guarantee")
@click.option("--floods", type=click.Choice(["full", "light"]), default="full", show_default=True,
              help="with --hostile: flood sizes (full: the sizes that showed each weakness; light: a few of each)")
@click.option("--skip-flood", "skip_floods", multiple=True, metavar="NAME",
              help="with --hostile: leave this flood out (to see what another one does alone); the verdicts it "
                   "decides are then not measured, so the run cannot pass; repeatable")
@click.option("--latency-target", "latency_targets", multiple=True, metavar="PATH=MS",
              help="with --hostile: a path's p99 target in ms (risk_pipeline_http, risk_pipeline_grpc, risk_stream, "
                   "gateway, llm); repeatable")
@click.option("--http-url", "http_url", metavar="HOST:PORT",
              help="with --hostile: soak a running `s2t serve --llm` (also give --grpc-url, --metrics-url and "
                   "--gateway) instead of starting one; nothing is stopped")
@click.option("--grpc-url", "grpc_url", metavar="HOST:PORT", help="with --http-url: its gRPC endpoint")
@click.option("--metrics-url", "metrics_url", metavar="HOST:PORT", help="with --http-url: its metrics endpoint")
@click.option("--gateway", "gateway_url", metavar="HOST:PORT", help="with --http-url: a running `s2t gateway`")
@click.option("--supervisor", "supervisor_url", metavar="HOST:PORT",
              help="with --http-url: its supervisor's metrics (`s2t serve --supervisor-port`), for the reload and "
                   "restart counters; without it that verdict is not measured")
def soak(minutes, rate, data_csv, report, hostile, floods, skip_floods, latency_targets, http_url, grpc_url,
         metrics_url, gateway_url, supervisor_url) -> None:
    """Serve (supervised, free ports) and send a fixed rate for MINUTES; exit 0 only when every request was
    answered, tritonserver is the process it was at the start, and the RSS of every serving process, fitted over
    the run after its warm-up, grows less than 5% when projected to 72 hours.

    With --hostile, valid traffic on risk_pipeline (HTTP and gRPC), risk_stream, the legacy gateway and llm beside
    idle streams and calls, 1 MiB records, abandoned LLM requests, bogus routes, oversized bodies, admin-API
    probes, gRPC callers whose deadlines expire, streams cancelled mid-stream, invalid records, malformed BYTES
    buffers, the classification of a BYTES output, damaged gRPC streams, overlong protobuf varints, and a greedy
    client holding calls that never send; exit 0 only when every guarantee held."""
    urls = {"http": http_url, "grpc": grpc_url, "metrics": metrics_url, "gateway": gateway_url}
    given = {name for name, url in urls.items() if url}
    if (given or supervisor_url) and (not hostile or len(given) < len(urls)):
        raise click.UsageError("--http-url, --grpc-url, --metrics-url and --gateway go together, with --hostile "
                               "(--supervisor with them)")
    if supervisor_url:
        urls["supervisor"] = supervisor_url
    if skip_floods and not hostile:
        raise click.UsageError("--skip-flood goes with --hostile")
    report.parent.mkdir(parents=True, exist_ok=True)
    if hostile:
        return _hostile_soak(minutes, 4.0 if rate is None else rate, data_csv, report, floods,
                             _latency_targets(latency_targets), urls if given else None, frozenset(skip_floods))
    from s2t.soak.supervised import supervised_soak
    with progress("soak", "s") as on_progress:
        result = supervised_soak(list(DEFAULT_REPOSITORIES), data_csv, minutes * 60, rate or 100.0, report,
                                 starting=step, on_progress=on_progress)
    report.write_text(result.to_json())
    click.echo(result.table())
    click.echo(f"report: {report}")
    sys.exit(0 if result.holds() else GATE_REFUSED)


def _latency_targets(items: tuple[str, ...]) -> dict[str, float]:
    from s2t.soak.hostile.valid_paths import LATENCY_TARGETS_MS
    targets = {}
    for item in items:
        path, _, ms = item.partition("=")
        if path not in LATENCY_TARGETS_MS:
            raise click.BadParameter(f"{path!r} is none of {', '.join(LATENCY_TARGETS_MS)}",
                                     param_hint="--latency-target")
        try:
            targets[path] = float(ms)
        except ValueError:
            raise click.BadParameter(f"{item!r}: the target is milliseconds, e.g. {path}=500",
                                     param_hint="--latency-target") from None
    return targets


def _hostile_soak(minutes, rate, data_csv, report, floods, targets, urls, skip_floods) -> None:
    from s2t.soak.hostile import runner
    from s2t.soak.hostile.report import table
    from s2t.models import dataset
    try:
        options = runner.Options(minutes * 60, rate, floods, targets, skip_floods=skip_floods)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--skip-flood") from None
    with progress("soak", "s") as on_progress:
        result = runner.run(options,
                            dataset.load(data_csv).records(), on_progress, urls, log_base=report)
    report.write_text(json.dumps(result, indent=2, default=str))
    click.echo(table(result))
    click.echo(f"report: {report}")
    if not urls:
        click.echo(f"services' output: {report.with_suffix('.serve.log')}, {report.with_suffix('.gateway.log')}")
    sys.exit(0 if all(v["holds"] for v in result["verdicts"].values()) else GATE_REFUSED)


COMMANDS = (drift, soak)
