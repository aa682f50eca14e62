"""`s2t bench --mode gpu`: the TensorRT engines vs ONNX Runtime's CUDA execution provider vs the CPU, in-process,
over a batch sweep, with CUDA graphs on and off; and, given a Triton that serves the GPU repository, perf_analyzer
on risk_scorer_trt / risk_scorer_cuda / risk_scorer at the same batch sizes.

Every in-process call goes from rows in host memory to probabilities in host memory (copies included), the work
a serving instance does per batch. Needs a GPU, TensorRT (the serving image's version) and onnxruntime-gpu:
`make gpu-venv` (s2t/models/serving_image.py).
"""
from __future__ import annotations

import ctypes
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from s2t.models import tensorrt_engine
from s2t.bench.harness import machine_load, report
from s2t.bench.baselines.limit_baseline import time_calls
from s2t.bench.harness.machine_load import LoadWatch

BATCHES = (1, 8, 64, 256)
OPTIMA = (8, 64, 256)  # profile optima tried for the FP32 engine: the "tuned optimum" is the best of these


@dataclass(frozen=True)
class GpuPoint:
    engine: str  # "tensorrt fp32 opt 64", "onnxruntime CUDA EP", "onnxruntime CPU", ...
    batch: int
    cuda_graph: bool
    calls: int
    rows_per_s: float
    p50_ms: float
    p99_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


def timed(engine: str, batch: int, cuda_graph: bool, seconds: float, call: Callable[[int], None]) -> GpuPoint:
    return GpuPoint(engine, batch, cuda_graph, *time_calls(batch, seconds, call, warmup=50))


def windows(rows: int, batch: int) -> list[int]:
    """Start rows of the batches a sweep cycles through (different rows each call, as a server sees)."""
    return [(k * batch) % max(1, rows - batch + 1) for k in range(64)]


class _CudaGraph:
    """Capture of one enqueue on a stream, replayed with one launch (the CUDA runtime, through Polygraphy's
    handle on libcudart: no other CUDA binding needed)."""

    def __init__(self, stream_ptr: int, enqueue: Callable[[], None]):
        from polygraphy import cuda
        self._lib, self._stream = cuda.wrapper().handle, ctypes.c_void_p(stream_ptr)
        self._graph, self._exec = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self._lib.cudaStreamBeginCapture(self._stream, 0), "cudaStreamBeginCapture")  # mode: global
        enqueue()
        self._check(self._lib.cudaStreamEndCapture(self._stream, ctypes.byref(self._graph)), "cudaStreamEndCapture")
        self._check(self._lib.cudaGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                            ctypes.c_ulonglong(0)), "cudaGraphInstantiateWithFlags")

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with CUDA error {status}")

    def launch(self) -> None:
        self._check(self._lib.cudaGraphLaunch(self._exec, self._stream), "cudaGraphLaunch")

    def close(self) -> None:
        self._lib.cudaGraphExecDestroy(self._exec)
        self._lib.cudaGraphDestroy(self._graph)


def tensorrt_points(engine_path: Path, label: str, categorical: np.ndarray, numeric: np.ndarray,
                    batches: tuple[int, ...], seconds: float, unavailable: list[dict]) -> list[GpuPoint]:
    import tensorrt as trt
    from polygraphy import cuda

    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(Path(engine_path).read_bytes())
    limit = tensorrt_engine.engine_batch_limit(engine_path)
    points = []
    for batch in (b for b in batches if b <= limit):
        # One context, stream and set of device buffers per batch size, timed without and then with a graph.
        context, stream = engine.create_execution_context(), cuda.Stream()
        cat_dev = cuda.DeviceArray(shape=(batch, categorical.shape[1]), dtype=np.int64)
        num_dev = cuda.DeviceArray(shape=(batch, numeric.shape[1]), dtype=np.float32)
        out_dev = cuda.DeviceArray(shape=(batch, 1), dtype=np.float32)
        out_host = np.empty((batch, 1), np.float32)
        try:
            context.set_input_shape("categorical", (batch, categorical.shape[1]))
            context.set_input_shape("numeric", (batch, numeric.shape[1]))
            for name, array in (("categorical", cat_dev), ("numeric", num_dev), ("probability", out_dev)):
                context.set_tensor_address(name, array.ptr)

            def enqueue(context=context, stream=stream):
                return context.execute_async_v3(stream.ptr)

            enqueue()  # TensorRT settles shapes on the first enqueue; capture only a steady one
            stream.synchronize()
            starts = windows(len(categorical), batch)
            for graph in (False, True):
                try:
                    captured = _CudaGraph(stream.ptr, enqueue) if graph else None
                except RuntimeError as err:
                    unavailable.append({"engine": label, "batch": batch, "cuda_graph": True, "reason": str(err)})
                    continue

                run = captured.launch if captured else enqueue

                def call(i, batch=batch, starts=starts, run=run):
                    s = starts[i % len(starts)]
                    cat_dev.copy_from(np.ascontiguousarray(categorical[s:s + batch]), stream)
                    num_dev.copy_from(np.ascontiguousarray(numeric[s:s + batch]), stream)
                    run()
                    out_dev.copy_to(out_host, stream)
                    stream.synchronize()

                points.append(timed(label, batch, graph, seconds, call))
                if captured:
                    captured.close()
        finally:
            for array in (cat_dev, num_dev, out_dev):
                array.free()
            stream.free()
            del context
    return points


def onnxruntime_cuda_points(onnx_path: Path, categorical: np.ndarray, numeric: np.ndarray,
                            batches: tuple[int, ...], seconds: float, unavailable: list[dict]) -> list[GpuPoint]:
    """ONNX Runtime's CUDA EP; with CUDA graphs the inputs must sit at fixed device addresses (I/O binding),
    and a graph is captured per session, so one session per batch size."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(f"onnxruntime {ort.__version__} here has no CUDA execution provider: install "
                           f"onnxruntime-gpu=={tensorrt_engine.ONNXRUNTIME_GPU_VERSION} (`make gpu-venv`)")
    points = []
    for batch in batches:
        starts = windows(len(categorical), batch)
        plain = ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"])

        def call(i, batch=batch, starts=starts, session=plain):
            s = starts[i % len(starts)]
            session.run(None, {"categorical": categorical[s:s + batch], "numeric": numeric[s:s + batch]})

        points.append(timed("onnxruntime CUDA EP", batch, False, seconds, call))
        try:
            points.append(_onnxruntime_graphed(ort, onnx_path, categorical, numeric, batch, starts, seconds))
        except Exception as err:  # noqa: BLE001 - ORT refuses graphs when a node falls back to the CPU
            unavailable.append({"engine": "onnxruntime CUDA EP", "batch": batch, "cuda_graph": True,
                                "reason": str(err).strip().splitlines()[0]})
    return points


def _onnxruntime_graphed(ort, onnx_path: Path, categorical: np.ndarray, numeric: np.ndarray, batch: int,
                         starts: list[int], seconds: float) -> GpuPoint:
    session = ort.InferenceSession(str(onnx_path), providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    cat_dev = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(categorical[:batch]), "cuda", 0)
    num_dev = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(numeric[:batch]), "cuda", 0)
    out_dev = ort.OrtValue.ortvalue_from_shape_and_type([batch, 1], np.float32, "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input("categorical", cat_dev)
    binding.bind_ortvalue_input("numeric", num_dev)
    binding.bind_ortvalue_output("probability", out_dev)

    def call(i):
        s = starts[i % len(starts)]
        cat_dev.update_inplace(np.ascontiguousarray(categorical[s:s + batch]))
        num_dev.update_inplace(np.ascontiguousarray(numeric[s:s + batch]))
        session.run_with_iobinding(binding)
        out_dev.numpy()

    return timed("onnxruntime CUDA EP", batch, True, seconds, call)


def onnxruntime_cpu_points(onnx_path: Path, categorical: np.ndarray, numeric: np.ndarray,
                           batches: tuple[int, ...], seconds: float) -> list[GpuPoint]:
    from s2t.bench.baselines.limit_baseline import session
    sess = session(onnx_path)
    points = []
    for batch in batches:
        starts = windows(len(categorical), batch)

        def call(i, batch=batch, starts=starts):
            s = starts[i % len(starts)]
            sess.run(None, {"categorical": categorical[s:s + batch], "numeric": numeric[s:s + batch]})

        points.append(timed("onnxruntime CPU (1 thread)", batch, False, seconds, call))
    return points


def best_optimum(points: list[GpuPoint]) -> dict:
    """The profile optimum whose FP32 engine gave the most rows/s summed over the sweep (graphs off)."""
    totals: dict[str, float] = {}
    for p in points:
        if p.engine.startswith("tensorrt fp32 opt") and not p.cuda_graph:
            totals[p.engine] = totals.get(p.engine, 0.0) + p.rows_per_s
    if not totals:
        return {}
    best = max(totals, key=totals.get)
    return {"engine": best, "optimum": int(best.rsplit(" ", 1)[1]), "rows_per_s_summed": totals}


def markdown(points: list[GpuPoint], gpu: str, optimum: dict, served: list[dict] = (),
             unavailable: list[dict] = (), load: dict | None = None) -> str:
    """`load`: the run's machine-load summary; its verdict comes right under the heading."""
    lines = [f"# GPU benchmark ({gpu})", "", *(machine_load.markdown_lines(load) if load else []),
             "In-process, host rows in to host probabilities out, one caller.", "",
             "| engine | batch | CUDA graph | rows/s | p50 ms | p99 ms |", "|---|---:|:---:|---:|---:|---:|"]
    for p in points:
        lines.append(f"| {p.engine} | {p.batch} | {'on' if p.cuda_graph else 'off'} | {p.rows_per_s:,.0f} | "
                     f"{p.p50_ms:.3f} | {p.p99_ms:.3f} |")
    if optimum:
        lines += ["", f"Best profile optimum for the FP32 engine: {optimum['optimum']} "
                      "(set it as risk_scorer_trt's largest preferred_batch_size)."]
    for u in unavailable:
        lines.append(f"- not measured: {u['engine']} batch {u['batch']} with a CUDA graph: {u['reason']}")
    if served:
        lines += ["", "## Served by Triton (perf_analyzer, gRPC, 2 callers)", "",
                  "| model | batch | rows/s | p99 ms |", "|---|---:|---:|---:|"]
        lines += [f"| {p['model']} | {p['batch']} | {p['infer_per_s']:,.0f} | {p['p99_ms']:.2f} |" for p in served]
    return "\n".join(lines) + "\n"


SERVED_MODELS = ("risk_scorer_trt", "risk_scorer_cuda", "risk_scorer")


def served_points(url: str, categorical: np.ndarray, numeric: np.ndarray, batches: tuple[int, ...],
                  out_dir: Path) -> list[dict]:
    """perf_analyzer (gRPC, 2 callers) on each scorer the server at `url` serves, at each batch size."""
    from s2t.bench.load import perf_analyzer
    from s2t.bench.harness import workload
    input_data = out_dir / "perf_input_scorer.json"
    input_data.write_text(json.dumps(workload.perf_input_scorer(categorical, numeric)))
    settings = perf_analyzer.Settings(requests=500, stability_percent=20)
    return [perf_analyzer.measure(url, "grpc", model, input_data, settings, batch=batch, concurrency=2).as_dict()
            for model in SERVED_MODELS for batch in batches]


def run(onnx_path: Path, data_csv: Path, out_dir: Path, seconds: float = 1.0, batches: tuple[int, ...] = BATCHES,
        optima: tuple[int, ...] = OPTIMA, url: str | None = None, log: Callable[[str], None] = print) -> dict:
    """`url`: gRPC HOST:PORT of a Triton serving model_repository_gpu (the compose `gpu` profile)."""
    from s2t.gate import parity
    from s2t.models import dataset

    gpu = tensorrt_engine.cuda_device()
    tensorrt_engine.import_tensorrt()
    tensorrt_engine.use_wheel_cuda_runtime()
    data = dataset.load(Path(data_csv))
    categorical, numeric = parity.packed_inputs(Path(onnx_path), data.columns)
    out_dir = Path(out_dir)
    engines_dir = out_dir / "engines"
    cache = engines_dir / "timing.cache"
    points: list[GpuPoint] = []
    unavailable: list[dict] = []  # variants that could not run here, with the reason (e.g. a graph ORT refused)
    max_batch = max(batches)
    # The machine's load in each measured group of points: a run beside other work is marked not publishable.
    watch = LoadWatch()
    # An optimum beyond the largest batch measured is that batch: the profile's optimum cannot exceed its maximum.
    for optimum in sorted({min(o, max_batch) for o in optima}):
        engine = engines_dir / f"risk_scorer.fp32.opt{optimum}.plan"
        log(f"building {engine.name}")
        profile = tensorrt_engine.BatchProfile(1, optimum, max_batch)
        tensorrt_engine.build_engine(Path(onnx_path), engine, "fp32", profile, cache)
        with watch.round(f"tensorrt fp32 opt {optimum}"):
            points += tensorrt_points(engine, f"tensorrt fp32 opt {optimum}", categorical, numeric, batches, seconds,
                                      unavailable)
    best = best_optimum(points)
    chosen = best.get("optimum", max_batch)
    fp16 = engines_dir / f"risk_scorer.fp16.opt{chosen}.plan"
    log(f"building {fp16.name}")
    tensorrt_engine.build_engine(Path(onnx_path), fp16, "fp16", tensorrt_engine.BatchProfile(1, chosen, max_batch),
                                 cache)
    with watch.round(f"tensorrt fp16 opt {chosen}"):
        points += tensorrt_points(fp16, f"tensorrt fp16 opt {chosen}", categorical, numeric, batches, seconds,
                                  unavailable)
    log("onnxruntime CUDA EP")
    with watch.round("onnxruntime CUDA EP"):
        points += onnxruntime_cuda_points(Path(onnx_path), categorical, numeric, batches, seconds, unavailable)
    log("onnxruntime CPU")
    with watch.round("onnxruntime CPU"):
        points += onnxruntime_cpu_points(Path(onnx_path), categorical, numeric, batches, seconds)
    out_dir.mkdir(parents=True, exist_ok=True)
    served = []
    if url:
        log(f"perf_analyzer against {url}")
        with watch.round("perf_analyzer"):
            served = served_points(url, categorical, numeric, batches, out_dir)
    load = watch.summary()
    results = {"gpu": gpu, "tensorrt": tensorrt_engine.TENSORRT_VERSION, "points": [p.as_dict() for p in points],
               "best_optimum": best, "served": served, "unavailable": unavailable, "load": load,
               "publishable": load["publishable"]}
    report.write_files(out_dir, results, markdown(points, gpu, best, served, unavailable, load))
    return results
