"""`s2t bench --mode crossover`: the same pipeline with heavier scorers, Triton's dynamic batching vs per-request
FastAPI.

A heavier scorer is the converted German Credit graph plus a dense branch of `width` units and `depth` layers on the
numeric inputs, whose output is squashed (Tanh) and scaled by 1e-12 before it is added to the probability: the
scorer costs what a wider network would, and its answers stay those of the real model (the added term is below
float32 resolution), so parity and the decisions still hold. Each heavier file is published as a version of
`risk_scorer`; risk_pipeline runs it (`scorer_version`) and the FastAPI app loads the same file; both are measured
side by side with the same wrk.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from s2t.backends.records.feature_spec import NUMERIC_INPUT, PROBABILITY_OUTPUT
from s2t.bench.harness import report, workload
from s2t.bench.harness.repository import copy_repository, edit_config
from s2t.bench.harness.rounds import median_round, take_turns
from s2t.bench.load import wrk
from s2t.bench.harness.machine_load import LoadWatch, machine
from s2t.bench.baselines.fastapi_baseline import ROUTE, BaselineServer
from s2t.on_progress import OnProgress, no_progress
from s2t.serve.triton_server import TritonServer, free_port

WIDTHS = (0, 256, 1024, 2048)
DEPTH = 2
SCALE = 1e-12


def heavier(onnx_path: Path, width: int, depth: int, out: Path) -> Path:
    """The scorer with a dense branch of `depth` layers of `width` units added (width 0: the scorer unchanged)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(onnx_path))
    if width > 0:
        graph, rng = model.graph, np.random.default_rng(width)
        produced = {o.name for o in graph.output}
        if PROBABILITY_OUTPUT not in produced:
            raise ValueError(f"{onnx_path} has no {PROBABILITY_OUTPUT} output")
        # Rename the real output inside the graph; the new last node produces the public name again.
        for node in graph.node:
            node.output[:] = ["s2t_real_probability" if o == PROBABILITY_OUTPUT else o for o in node.output]
        n_numeric = graph.input[[i.name for i in graph.input].index(NUMERIC_INPUT)].type.tensor_type.shape.dim[1]
        previous, fan_in, nodes = NUMERIC_INPUT, n_numeric.dim_value, []
        for layer in range(depth):
            weight = numpy_helper.from_array((rng.standard_normal((fan_in, width)) / np.sqrt(fan_in)).astype(np.float32),
                                             f"s2t_heavy_w{layer}")
            graph.initializer.append(weight)
            nodes += [helper.make_node("MatMul", [previous, weight.name], [f"s2t_heavy_mm{layer}"]),
                      helper.make_node("Relu", [f"s2t_heavy_mm{layer}"], [f"s2t_heavy_h{layer}"])]
            previous, fan_in = f"s2t_heavy_h{layer}", width
        graph.initializer.append(numpy_helper.from_array(np.array(SCALE, dtype=np.float32), "s2t_heavy_scale"))
        nodes += [helper.make_node("ReduceMean", [previous], ["s2t_heavy_mean"], axes=[1], keepdims=1),
                  helper.make_node("Tanh", ["s2t_heavy_mean"], ["s2t_heavy_tanh"]),
                  helper.make_node("Mul", ["s2t_heavy_tanh", "s2t_heavy_scale"], ["s2t_heavy_term"]),
                  helper.make_node("Add", ["s2t_real_probability", "s2t_heavy_term"], [PROBABILITY_OUTPUT])]
        graph.node.extend(nodes)
    onnx.checker.check_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def run(out_dir: Path, repository: Path, onnx_path: Path, data_csv: Path, seconds: float = 4.0, rounds: int = 3,
        widths: tuple[int, ...] = WIDTHS, log=print, on_progress: OnProgress = no_progress) -> dict:
    """req/s and p99 of risk_pipeline and the FastAPI docs-style app for each scorer width; a plot beside them.

    `on_progress` hears the steps done (per width: the servers' start, then each side's wrk rounds), naming the one
    that runs."""
    payloads = workload.Workload.load(Path(data_csv)).payloads()
    points = []
    # The machine's load in each measured wrk round: a run beside other work is marked not publishable.
    watch = LoadWatch()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    steps, done = len(widths) * (1 + 2 * rounds), 0
    with tempfile.TemporaryDirectory(prefix="s2t-crossover-") as tmp:
        tmp = Path(tmp)
        repo = tmp / "model_repository"
        copy_repository(Path(repository), repo, ("risk_pipeline", "risk_scorer"))
        # The scorer's versions are the heavier files alone.
        for version_dir in (repo / "risk_scorer").iterdir():
            if version_dir.is_dir() and version_dir.name.isdigit():
                shutil.rmtree(version_dir)
        for version, width in enumerate(widths, start=1):
            heavier(Path(onnx_path), width, DEPTH, repo / "risk_scorer" / str(version) / "model.onnx")
        triton_script = wrk.write_script(tmp / "triton.lua", "/v2/models/risk_pipeline/infer",
                                         [workload.triton_json_body(p) for p in payloads])
        base_script = wrk.write_script(tmp / "base.lua", ROUTE, [p.decode() for p in payloads])
        for version, width in enumerate(widths, start=1):
            _set_scorer_version(repo / "risk_pipeline", version)
            server = TritonServer([repo], free_port(), free_port(), free_port(), exit_timeout_seconds=5,
                                  log_path=tmp / "triton.log", stop_gracefully=False)
            base = BaselineServer(repo / "risk_scorer" / str(version) / "model.onnx", repo / "risk_pipeline",
                                  free_port(), app="fastapi-docs", log_path=tmp / "fastapi.log")
            try:
                on_progress(done, steps, f"width {width}: servers starting")
                server.start()
                base.start()
                done += 1
                point = {"width": width, "depth": DEPTH if width else 0}
                sides = {"triton": ("http://" + server.http_url, triton_script), "fastapi": (base.url, base_script)}

                def one(side: str, number: int) -> dict:
                    nonlocal done
                    url, script = sides[side]
                    label = f"width {width}: wrk {side} round {number + 1}"
                    on_progress(done, steps, label)
                    wrk.run(url, script, 16, 1)
                    with watch.round(label):
                        found = wrk.run(url, script, 16, seconds).as_dict()
                    done += 1
                    return found

                # The sides take turns; each one's figure is its median round (the machine's load moves).
                for side, results in take_turns(list(sides), rounds, one).items():
                    result = median_round(results, "throughput")
                    point[side] = {"throughput": result["throughput"], "p50_ms": result["p50_ms"],
                                   "p99_ms": result["p99_ms"], "errors": sum(r["errors"] for r in results),
                                   "rounds_throughput": [r["throughput"] for r in results]}
                point["ratio"] = point["triton"]["throughput"] / point["fastapi"]["throughput"]
                points.append(point)
                log(f"width {width}: Triton {point['triton']['throughput']:.0f} req/s, FastAPI "
                    f"{point['fastapi']['throughput']:.0f} req/s ({point['ratio']:.2f}x)")
            finally:
                base.stop()
                server.stop()
    load = watch.summary()
    results = {"depth": DEPTH, "points": points, "started": started,
               "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
               "load": load, "publishable": load["publishable"]}
    report.write_files(Path(out_dir), results, name="crossover")
    _plot(points, Path(out_dir) / "crossover.png")
    on_progress(done, steps, f"results in {out_dir}")
    return results


def _set_scorer_version(model_dir: Path, version: int) -> None:
    def change(config) -> None:
        config.parameters["scorer_version"].string_value = str(version)
    edit_config(model_dir, change)


def _plot(points: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [p["width"] for p in points]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for side, label in (("triton", "Triton risk_pipeline (dynamic batching)"), ("fastapi", "FastAPI (per request)")):
        ax1.plot(widths, [p[side]["throughput"] for p in points], marker="o", label=label)
        ax2.plot(widths, [p[side]["p99_ms"] for p in points], marker="o", label=label)
    ax1.set(xlabel=f"extra dense width ({DEPTH} layers)", ylabel="requests/s", title="HTTP JSON, wrk, 16 connections")
    ax2.set(xlabel=f"extra dense width ({DEPTH} layers)", ylabel="p99 ms", title="p99", yscale="log")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
