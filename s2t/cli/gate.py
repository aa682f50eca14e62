"""Commands that judge a model before it serves: parity against the legacy model, the configs, the gated publish."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from s2t.cli.options import (DEFAULT_DATA, DEFAULT_REPOSITORIES, DEFAULT_SAVED_MODEL, emit, http_url_option,
                             json_option, repositories_option, server_address)
from s2t.cli.progress import progress, step
from s2t.cli.rollouts import consumers_option, repository_option, rollout_of, url_option
from s2t.control.reachability import require_reachable
from s2t.errors import GATE_REFUSED


@click.command()
@click.option("--saved-model", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="the legacy SavedModel: the reference")
@click.option("--onnx", "onnx_model", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="the converted model compared with it")
@click.option("--data", "data_csv", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="records, one per row, columns named as the SavedModel's inputs")
@http_url_option("also score the live model on this Triton, over HTTP", name="http_url", envvar=None,
                 contract_spelling="--url")
@click.option("--grpc-url", metavar="HOST:PORT", help="also score the live model on this Triton, over gRPC")
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
@click.option("--live-precision", "live_precision", type=click.Choice(["fp32", "fp16"]), default="fp32",
              show_default=True,
              help="the precision the live model computes in (fp16: a TensorRT FP16 engine, gated at --fp16-atol)")
@json_option
def parity(saved_model, onnx_model, data_csv, http_url, grpc_url, model, atol, report, decision_config,
           fp16_emulation, engines, fp16_atol, live_precision, as_json) -> None:
    """Legacy SavedModel vs ONNX Runtime (vs engines, vs the live model) on every row; exit 0 iff all within tolerance.

    Decisions (APPROVE/REVIEW/DECLINE, with risk_decision's thresholds) are compared too: rows that change are listed.
    A model converted from a tf.Example signature is given one Example per CSV row (columns named as its features).
    """
    from s2t.gate import parity as run_parity
    from s2t.triton_config import decision_thresholds
    if decision_config is None and run_parity.DECISION_CONFIG.is_file():
        decision_config = run_parity.DECISION_CONFIG
    thresholds = decision_thresholds(decision_config.parent) if decision_config else None
    fp16_atol = fp16_atol or run_parity.FP16_ATOL
    url, protocol = server_address(http_url, grpc_url)
    require_reachable(url, protocol)
    with progress("parity", "rows") as on_progress:
        result = run_parity.run(saved_model, onnx_model, data_csv, atol=atol, url=url, model=model,
                                protocol=protocol, thresholds=thresholds, fp16_emulation=fp16_emulation,
                                engines=tuple(engines), fp16_atol=fp16_atol,
                                url_atol=fp16_atol if live_precision == "fp16" else None, on_progress=on_progress)
    if report:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.to_json())
    emit(as_json, json.loads(result.to_json()), result.table())
    sys.exit(0 if result.passed else GATE_REFUSED)


@click.command("check-config")
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


@click.command()
@click.argument("model")
@click.argument("artifact", type=click.Path(path_type=Path))
@repository_option
@consumers_option
@click.option("--stage", is_flag=True,
              help="load it as a candidate (MODEL:N for canary, shadow and route=) with no primary traffic; a "
                   "model that pins its versions (llm) loads it only once promoted")
@click.option("--saved-model", type=click.Path(path_type=Path), default=DEFAULT_SAVED_MODEL, show_default=True,
              help="legacy reference for the parity gate")
@click.option("--data", "data_csv", type=click.Path(path_type=Path), default=DEFAULT_DATA, show_default=True,
              help="records the parity gate scores")
@click.option("--atol", type=float, default=1e-5, show_default=True,
              help="parity gate: largest |difference| in probability that passes")
@url_option
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
    from s2t.control.publish import ParityGate, is_gguf, publish as run_publish
    require_reachable(url)
    consumers = rollout_of(model, repository, consumer_repositories, url).consumer_repositories
    checks = ("load, chat template, a few tokens" if is_gguf(artifact)
              else f"parity gate against {saved_model} on {data_csv}")
    with step(f"{model}: validating {artifact} ({checks}), moving it in"):
        version = run_publish(model, artifact, repository, ParityGate(saved_model, data_csv, atol), stage=stage,
                              consumer_repositories=consumers, url=url, settings=settings)
    if stage:
        click.echo(f"{model}: version {version} staged: loaded, no primary traffic "
                   f"(`s2t canary {model} {version} --percent P`, `s2t promote {model} {version}`)", err=True)
    else:
        click.echo(f"{model}: version {version} rolled out at once: it is the primary on every path "
                   "(use --stage for a canary first)", err=True)
    emit(as_json, {"model": model, "version": version, "staged": stage}, str(version))


COMMANDS = (parity, check_config, publish)
