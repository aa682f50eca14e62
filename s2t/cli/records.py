"""Commands that send records: one legacy record scored, German Credit replayed on ordered streams."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from s2t.cli.failures import about
from s2t.cli.options import DEFAULT_DATA, grpc_url_option, http_url_option
from s2t.control.reachability import is_invalid_input, require_reachable
from s2t.errors import GATE_REFUSED, GateRefused, RecordRejected


@click.command()
@click.argument("record", type=click.File("rb"), metavar="RECORD.json|-")
@http_url_option("Triton's HTTP endpoint [default: localhost:8000]", contract_spelling="--url")
@click.option("--grpc-url", metavar="HOST:PORT", help="score over gRPC at this Triton endpoint instead of HTTP")
# The public contract names `--url` with `--protocol grpc` for gRPC; the help shows --grpc-url, one spelling.
@click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", hidden=True)
@click.option("--model", default="risk_pipeline", show_default=True,
              help="the model that scores it: any with risk_pipeline's inputs and outputs (risk_router)")
@click.option("--timeout-s", type=float, default=60.0, show_default=True, help="longest the answer is waited for")
def score(record, url, grpc_url, protocol, model, timeout_s) -> None:
    """Score one legacy RECORD (a JSON file, or - for stdin); prints {request_id, probability, decision} as JSON.

    The record goes to the server as it is, so an invalid one gets the server's own error, naming the field."""
    from tritonclient.utils import InferenceServerException

    from s2t.clients.risk_client import score_payload
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
        with about(f"{model} at {url}: "):
            probability, decision = score_payload(payload, url, protocol, model, timeout_s)
    except InferenceServerException as err:
        if not is_invalid_input(err):
            raise
        click.echo(json.dumps({"request_id": request_id, "error": err.message()}, sort_keys=True))
        raise RecordRejected(err.message()) from None
    click.echo(json.dumps({"request_id": request_id, "probability": probability, "decision": decision},
                          sort_keys=True))


@click.command()
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
    from s2t.clients import stream_client
    from s2t.models import dataset
    require_reachable(url, "grpc")
    rows = [{"features": f} for f in dataset.load(dataset.fetch_german_credit(data_csv)).records()]
    replayed = [rows[i % len(rows)] for i in range(records)]
    results, _, seconds = stream_client.replay(url, replayed, streams, shuffle=shuffle, window=window,
                                               duplicate=duplicate, loss=loss, form=form, seed=seed, rate=rate)
    summary = stream_client.summarize(results, seconds)
    click.echo(summary.table())
    incomplete = [r.stream for r in results if not r.complete]
    if incomplete:
        raise GateRefused(f"streams without every answer: {', '.join(incomplete)}")
    if summary.in_order_rate < 1.0 or not summary.exactly_once:
        sys.exit(GATE_REFUSED)


COMMANDS = (score, stream)
