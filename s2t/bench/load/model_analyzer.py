"""`s2t bench --mode model-analyzer`: Triton Model Analyzer's instance and batch sweep on the embedded server.

Model Analyzer (PyPI `triton-model-analyzer`) starts `tritonserver` itself in its `local` launch mode, so it is
pointed at the wheel's binary, the backend directory `s2t serve` assembles and the same environment; perf_analyzer
is called through a wrapper that adds the CUDA runtime library the wheel's perf_analyzer links against (Model
Analyzer runs it with an environment of its own). It profiles config variants of `risk_pipeline` (and `risk_scorer`,
its sibling, is copied beside them, as the pipeline loads the scorer's file from its own repository).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from s2t.models import dataset
from s2t.bench.harness.repository import copy_repository
from s2t.bench.load import perf_analyzer
from s2t.serve.triton_server import TRITON_DIR, assemble_backend_dir, server_env

PROFILED = "risk_pipeline"
COPIED = ("risk_pipeline", "risk_scorer")
RECORDS = 100


def config_yaml(work: Path, concurrency: int, max_instances: int) -> str:
    env = server_env()
    return "\n".join([
        f"model_repository: {work / 'repository'}",
        f"output_model_repository_path: {work / 'variants'}",
        "override_output_model_repository: true",
        f"checkpoint_directory: {work / 'checkpoints'}",
        f"export_path: {work / 'export'}",
        "triton_launch_mode: local",
        f"triton_server_path: {TRITON_DIR / 'bin' / 'tritonserver'}",
        f"perf_analyzer_path: {work / 'perf_analyzer.sh'}",
        "triton_server_flags:",
        f"  backend_directory: {work / 'backends'}",
        "triton_server_environment:",
        f"  LD_LIBRARY_PATH: \"{env['LD_LIBRARY_PATH']}\"",
        f"  PATH: \"{env['PATH']}\"",
        f"run_config_search_max_instance_count: {max_instances}",
        f"run_config_search_min_concurrency: {concurrency}",
        f"run_config_search_max_concurrency: {concurrency}",
        "profile_models:",
        f"  {PROFILED}:",
        "    cpu_only: true",
        "    perf_analyzer_flags:",
        f"      input-data: {work / 'records.json'}",
        "",
    ])


def prepare(work: Path, repository: Path, data_csv: Path, concurrency: int = 16, max_instances: int = 2) -> Path:
    """The repository copy, backend directory, records, perf_analyzer wrapper and config Model Analyzer needs."""
    copy_repository(Path(repository), work / "repository", COPIED)
    assemble_backend_dir(work / "backends")
    records = dataset.load(Path(data_csv)).records()[:RECORDS]
    (work / "records.json").write_text(json.dumps(
        {"data": [{"payload": {"content": [json.dumps({"features": r})], "shape": [1]}} for r in records]}))
    wrapper = work / "perf_analyzer.sh"
    wrapper.write_text(f"#!/bin/sh\nLD_LIBRARY_PATH={perf_analyzer.environment()['LD_LIBRARY_PATH']} "
                       f"exec {perf_analyzer.binary()} \"$@\"\n")
    wrapper.chmod(0o755)
    config = work / "config.yaml"
    config.write_text(config_yaml(work, concurrency, max_instances))
    return config


def run(out_dir: Path, repository: Path, data_csv: Path, log=print) -> Path:
    """Profile; returns Model Analyzer's inference metrics CSV (its reports lie beside it)."""
    analyzer = shutil.which("model-analyzer") or str(Path(sys.executable).parent / "model-analyzer")
    if not Path(analyzer).is_file():
        raise RuntimeError("triton-model-analyzer is not installed: "
                           ".venv/bin/pip install -c constraints.txt '.[analyzer]'")
    work = Path(out_dir).resolve() / "model_analyzer"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = prepare(work, repository, data_csv)
    log(f"model-analyzer profile -f {config}")
    with open(work / "model_analyzer.log", "w") as out:
        done = subprocess.run([analyzer, "profile", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT,
                              env=server_env())
    metrics = work / "export" / "results" / "metrics-model-inference.csv"
    if done.returncode != 0 or not metrics.is_file():
        raise RuntimeError(f"model-analyzer failed ({done.returncode}); see {work / 'model_analyzer.log'}")
    return metrics
