"""Every mode of `s2t bench`, in one table: a name, what it measures, and one function `run(BenchOptions) ->
BenchResult`. The command line lists and runs the modes from `BENCH_MODES` and knows none of them by name; how much
the side-by-side modes (smoke, quick, full) measure is in s2t/bench/harness/modes.py."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from s2t.bench.harness.modes import MODES
from s2t.control.reachability import require_reachable
from s2t.errors import S2TError
from s2t.on_progress import OnProgress, no_progress


@dataclass(frozen=True)
class BenchOptions:
    """Everything a mode may read; each mode reads what it needs."""

    out_dir: Path
    repositories: tuple[Path, ...]
    data_csv: Path
    onnx_model: Path  # gpu, crossover: the scorer the engines or the heavier variants are built from
    grpc_url: str | None  # gpu: a Triton serving model_repository_gpu
    saved_model: Path  # cutover: the legacy service's model
    llm_repository: Path
    # cpu-cost: the sides measured against each other (`NAME[:knob=value,...]`, s2t/bench/scenarios/cpu_cost.py); none: its
    # default pair.
    sides: tuple[str, ...] = ()
    # smoke, quick, full: the load generators of the HTTP / gRPC comparison (s2t/bench/scenarios/protocols.py, GENERATORS).
    protocol_clients: str = "low-cpu"
    log: Callable[[str], None] = print
    on_progress: OnProgress = no_progress

    @property
    def pipeline_repository(self) -> Path:
        return next((r for r in self.repositories if (Path(r) / "risk_pipeline").is_dir()), Path("model_repository"))


@dataclass(frozen=True)
class BenchResult:
    document: dict  # the mode's results as one JSON document, with `results`: where the tables are
    text: str  # what is shown to people


@dataclass(frozen=True)
class BenchMode:
    help: str
    run: Callable[[BenchOptions], BenchResult]


def _verdict(results: dict) -> str:
    """Whether the run may be published, and why not: the first thing a reader of the figures sees."""
    from s2t.bench.harness.machine_load import markdown_lines
    return "\n".join(markdown_lines(results["load"])) + "\n"


def _written(folder: Path) -> dict:
    """The document of a mode that wrote results.json and results.md into `folder`."""
    return {**json.loads((folder / "results.json").read_text()), "results": str(folder / "results.md")}


def _written_with_verdict(folder: Path) -> BenchResult:
    document = _written(folder)
    return BenchResult(document, _verdict(document) + f"results: {folder / 'results.md'}")


def _side_by_side(name: str) -> Callable[[BenchOptions], BenchResult]:
    def run(options: BenchOptions) -> BenchResult:
        from s2t.bench.harness.runner import Bench
        results = Bench(MODES[name], options.out_dir, list(options.repositories), options.data_csv, log=options.log,
                        on_progress=options.on_progress, protocol_clients=options.protocol_clients).run()
        from s2t.bench.harness.report import summary_lines
        summary = options.out_dir / "results.md"
        return BenchResult({**results, "results": str(summary)},
                           _verdict(results) + "\n".join(summary_lines(results) + [f"results: {summary}"]))
    return run


def _cutover(plan: str) -> Callable[[BenchOptions], BenchResult]:
    def run(options: BenchOptions) -> BenchResult:
        from s2t.bench.scenarios import cutover
        folder = options.out_dir / ("cutover-smoke" if plan == "smoke" else "cutover")
        cutover.run(cutover.PLANS[plan], folder, list(options.repositories), options.data_csv, options.saved_model,
                    log=options.log, on_progress=options.on_progress)
        return BenchResult(_written(folder), (folder / "results.md").read_text()
                           + f"\nresults: {folder / 'results.md'}")
    return run


def _gpu(options: BenchOptions) -> BenchResult:
    from s2t.bench.scenarios import gpu
    require_reachable(options.grpc_url, "grpc")
    gpu.run(options.onnx_model, options.data_csv, options.out_dir / "gpu", url=options.grpc_url, log=options.log)
    return _written_with_verdict(options.out_dir / "gpu")


def _crossover(options: BenchOptions) -> BenchResult:
    from s2t.bench.scenarios import crossover
    from s2t.bench.harness.machine_load import markdown_lines
    out = options.out_dir
    results = crossover.run(out, options.pipeline_repository, options.onnx_model, options.data_csv, log=options.log,
                            on_progress=options.on_progress)
    lines = [*markdown_lines(results["load"]), *(
        f"width {p['width']}: {p['ratio']:.2f}x (Triton {p['triton']['throughput']:.0f}, "
        f"FastAPI {p['fastapi']['throughput']:.0f} req/s)" for p in results["points"])]
    return BenchResult({**results, "results": str(out / "crossover.json")},
                       "\n".join(lines + [f"results: {out / 'crossover.json'}, {out / 'crossover.png'}"]))


def _model_analyzer(options: BenchOptions) -> BenchResult:
    from s2t.bench.load import model_analyzer
    metrics = model_analyzer.run(options.out_dir, options.pipeline_repository, options.data_csv, log=options.log)
    return BenchResult({"results": str(metrics)}, metrics.read_text() + f"\nresults: {metrics} (reports beside it)")


def _llm(options: BenchOptions) -> BenchResult:
    from s2t.bench.scenarios import llm
    llm.run(options.out_dir / "llm", list(options.repositories), options.llm_repository, options.data_csv,
            log=options.log, on_progress=options.on_progress)
    return _written_with_verdict(options.out_dir / "llm")


# `grpc-front`'s sides: risk_pipeline over gRPC with perf_analyzer, on Triton's own endpoint and through the gRPC front.
GRPC_FRONT_SIDES = ("direct:front=off,client=perf_analyzer,protocol=grpc", "front:client=perf_analyzer,protocol=grpc",
                    "process:front=process,client=perf_analyzer,protocol=grpc")


def _cpu_cost(plan: str, folder_name: str | None = None,
              default_sides: tuple[str, ...] = ()) -> Callable[[BenchOptions], BenchResult]:
    """cpu_cost's `plan` on the --side sides, or `default_sides` when none is named (none: cpu_cost's own)."""
    def run(options: BenchOptions) -> BenchResult:
        from s2t.bench.scenarios import cpu_cost
        try:
            sides = cpu_cost.parse_sides(options.sides or default_sides)
        except ValueError as err:
            raise S2TError(f"--side: {err}") from None
        folder = options.out_dir / (folder_name or plan.replace("-", "_"))
        _, text = cpu_cost.measure(sides, options.pipeline_repository, options.data_csv, cpu_cost.PLANS[plan],
                                   folder, log=options.log)
        document = _written(folder)
        return BenchResult(document, _verdict(document) + text + f"\nresults: {folder / 'results.md'}")
    return run


BENCH_MODES = {
    "smoke": BenchMode("only proves the machinery", _side_by_side("smoke")),
    "quick": BenchMode("under 3 minutes, two rounds a line", _side_by_side("quick")),
    "full": BenchMode("five rounds a line, the FastAPI apps at 1, 2 and 4 workers, the published points only "
                      "(about 10 minutes): the README's figures", _side_by_side("full")),
    "gpu": BenchMode("TensorRT vs ONNX Runtime CUDA EP vs CPU (needs a GPU, `make gpu-venv`)", _gpu),
    "model-analyzer": BenchMode("Triton Model Analyzer's instance/batch sweep of risk_pipeline "
                                "(pip install '.[analyzer]')", _model_analyzer),
    "crossover": BenchMode("heavier scorers, Triton vs per-request FastAPI", _crossover),
    "cutover": BenchMode("the legacy service vs skill2triton through the legacy protocol (about 2 minutes)",
                         _cutover("cutover")),
    "cutover-smoke": BenchMode("cutover on a short plan", _cutover("smoke")),
    "llm": BenchMode("tokens/s, TTFT, ITL, length-aware vs FIFO, risk_pipeline beside LLM streams", _llm),
    "cpu-cost": BenchMode("risk_pipeline's CPU per request, server variants (--side) taking turns",
                          _cpu_cost("cpu-cost")),
    "cpu-cost-smoke": BenchMode("cpu-cost on a short plan", _cpu_cost("cpu-cost-smoke")),
    "grpc-front": BenchMode("risk_pipeline over gRPC with perf_analyzer at c=16: Triton's own endpoint vs the gRPC "
                            "front inside tritonserver vs the front as a process, taking turns (cpu-cost's "
                            "plan)",
                            _cpu_cost("cpu-cost", "grpc_front", GRPC_FRONT_SIDES)),
}
