"""`s2t bench`: runs one mode of the table in s2t/bench/harness/registry.py."""
from __future__ import annotations

from pathlib import Path

import click

from s2t.bench.harness.registry import BENCH_MODES, BenchOptions
from s2t.cli.options import (DEFAULT_DATA, DEFAULT_ONNX, DEFAULT_REPOSITORIES, DEFAULT_SAVED_MODEL, LLM_REPOSITORY,
                             emit, grpc_url_option, json_option, repositories_option)
from s2t.cli.progress import progress


@click.command()
@click.option("--mode", type=click.Choice(list(BENCH_MODES)), default="quick", show_default=True,
              help="; ".join(f"{name}: {mode.help}" for name, mode in BENCH_MODES.items()))
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("bench/results"),
              show_default=True,
              help="where the tables, plots and results.json go")
@repositories_option("a repository to measure, copied first (repeatable) [default: ./model_repository and "
                     "./ensembles]")
@click.option("--data", "data_csv", type=click.Path(exists=True, path_type=Path), default=DEFAULT_DATA,
              show_default=True,
              help="German Credit CSV the load is made of")
@click.option("--onnx", "onnx_model", type=click.Path(path_type=Path), default=DEFAULT_ONNX,
              show_default=True, help="gpu mode: the model the engines are built from")
@grpc_url_option("gpu mode: Triton serving model_repository_gpu, measured with perf_analyzer", envvar=None)
@click.option("--saved-model", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="cutover mode: the legacy service's model")
@click.option("--side", "sides", multiple=True, metavar="NAME[:knob=value,...]",
              help="cpu-cost modes: a server variant and load generator to measure (repeatable; knobs in "
                   "docs/benchmarks.md) [default: base, two:instances=2]")
@click.option("--protocol-clients", type=click.Choice(["low-cpu", "perf_analyzer"]), default="low-cpu",
              show_default=True, help="smoke, quick, full: the load generators of the HTTP / gRPC comparison "
                                      "(low-cpu: wrk on HTTP, as the FastAPI comparison uses, and h2load on gRPC, "
                                      "each leaving the cores to the server; perf_analyzer on both sides spends "
                                      "more of them on its gRPC client than on its HTTP one)")
@json_option
def bench(mode, out_dir, repositories, data_csv, onnx_model, url, saved_model, sides, protocol_clients,
          as_json) -> None:
    """Triton (perf_analyzer, wrk) side by side with FastAPI + ONNX Runtime and in-process ONNX Runtime."""
    with progress(f"bench {mode}", "steps") as shown:
        options = BenchOptions(out_dir, tuple(repositories or DEFAULT_REPOSITORIES), data_csv, onnx_model, url,
                               saved_model, LLM_REPOSITORY, tuple(sides), protocol_clients, log=shown.echo,
                               on_progress=shown)
        result = BENCH_MODES[mode].run(options)
    emit(as_json, {"mode": mode, **result.document}, result.text)


COMMANDS = (bench,)
