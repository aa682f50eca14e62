"""`s2t build-trt`: a TensorRT engine from the converted risk model, for the TensorRT of the serving image.

Strings cannot enter TensorRT, so only the numeric core goes there. `s2t convert` already made the split: it lifts
tf2onnx's string lookups (CategoryMapper) out of the graph into the feature spec, which skill_adapter applies in
Python; risk_scorer's ONNX takes vocabulary indices (INT64) and numbers (FP32), and every op left in it (Gather,
Cast, Reshape, MatMul, Add, Relu, Sigmoid...) has a TensorRT layer. A graph that still carries string tensors or
ai.onnx.ml lookups is refused before TensorRT is touched, naming the node and the way out.

An engine is tied to the TensorRT version and the GPU model that built it: build it on the GPU it will serve on,
with the TensorRT of the serving image (TENSORRT_VERSION); the build report beside the engine records both.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from s2t.atomic_files import write_atomically
from s2t import triton_config
from s2t.triton_config import engine_report_path as report_path  # part of this module's interface
from s2t.models.serving_image import SERVING_IMAGE, release_of, same_release
from s2t.errors import S2TError

# The versions of the image deploy/triton builds on (s2t/models/serving_image.py): an engine loads only in the
# TensorRT release that built it.
SERVING_RELEASE = release_of(SERVING_IMAGE)
TENSORRT_VERSION = SERVING_RELEASE.tensorrt
TENSORRT_REQUIREMENT = f"tensorrt-cu{SERVING_RELEASE.cuda_major}=={TENSORRT_VERSION}"
ONNXRUNTIME_GPU_VERSION = SERVING_RELEASE.onnxruntime
PRECISIONS = ("fp32", "fp16")
# Ops that take or make strings (ai.onnx.ml lookups, string ops): TensorRT has no string type.
STRING_OPS = {"CategoryMapper", "LabelEncoder", "StringNormalizer", "TfIdfVectorizer", "RegexFullMatch",
              "StringSplit", "StringConcat", "DictVectorizer", "ZipMap"}
WORKSPACE_MIB = 1024


class EngineBuildError(S2TError):
    """The engine cannot be built here or from this model; the message says why and what to do."""


@dataclass(frozen=True)
class Blocker:
    node: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op}): {self.reason}"


def tensorrt_blockers(model: onnx.ModelProto) -> list[Blocker]:
    """What keeps this graph out of TensorRT; empty when the whole graph is a numeric core."""
    blockers = []
    for value in list(model.graph.input) + list(model.graph.output):
        if value.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            blockers.append(Blocker(value.name, "graph input/output", "a string tensor"))
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.STRING:
            blockers.append(Blocker(tensor.name, "initializer", "a string constant"))
    for node in model.graph.node:
        name = node.name or (node.output[0] if node.output else "?")
        if node.op_type in STRING_OPS:
            blockers.append(Blocker(name, node.op_type, "a string lookup"))
        elif node.domain not in ("", "ai.onnx"):
            blockers.append(Blocker(name, node.op_type, f"an op of domain {node.domain!r}"))
    return blockers


@dataclass(frozen=True)
class BatchProfile:
    """TensorRT's optimization profile for the batch dimension: kernels are timed at `optimum`."""

    minimum: int
    optimum: int
    maximum: int

    def __post_init__(self):
        if not 1 <= self.minimum <= self.optimum <= self.maximum:
            raise ValueError(f"batch profile needs 1 <= min <= opt <= max, got {self.minimum}/{self.optimum}/"
                             f"{self.maximum}")


def profile_for_config(config_dir: Path | None, max_batch: int | None = None, opt_batch: int | None = None
                       ) -> BatchProfile:
    """The profile the Triton model needs: up to its max_batch_size, timed at its largest preferred batch size.

    The dynamic batcher forms the preferred sizes under load, so those are the shapes worth the best kernels.
    """
    config = None
    if config_dir is not None and (Path(config_dir) / "config.pbtxt").is_file():
        config = triton_config.load(Path(config_dir))
    if max_batch is None:
        if config is None or config.max_batch_size < 1:
            raise EngineBuildError(f"no batching config at {config_dir}: give --max-batch-size")
        max_batch = config.max_batch_size
    if opt_batch is None:
        preferred = list(config.dynamic_batching.preferred_batch_size) if config is not None else []
        opt_batch = min(max(preferred), max_batch) if preferred else max_batch
    return BatchProfile(1, opt_batch, max_batch)


def profile_shapes(model: onnx.ModelProto, profile: BatchProfile) -> dict[str, tuple[tuple, tuple, tuple]]:
    """(min, opt, max) shape of every graph input: the batch dimension from the profile, the rest as declared."""
    initializers = {t.name for t in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if not dims:
            raise EngineBuildError(f"input {value.name!r} is a scalar; the engine needs a batch dimension")
        if dims[0].HasField("dim_value"):
            raise EngineBuildError(f"input {value.name!r} has a fixed batch dimension ({dims[0].dim_value}); "
                                   "convert with a dynamic batch (`s2t convert` does)")
        rest = []
        for dim in dims[1:]:
            if not dim.HasField("dim_value"):
                raise EngineBuildError(f"input {value.name!r} has a dynamic non-batch dimension "
                                       f"({dim.dim_param or '?'}); the profile covers the batch only")
            rest.append(dim.dim_value)
        shapes[value.name] = tuple((batch, *rest) for batch in (profile.minimum, profile.optimum, profile.maximum))
    return shapes


def cuda_device() -> str:
    """Name of GPU 0 through the driver API; raises EngineBuildError saying why there is none."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        raise EngineBuildError("no NVIDIA driver here (libcuda.so.1 not found): TensorRT engines are built on "
                               "the GPU they will serve on") from None
    status = cuda.cuInit(0)
    count = ctypes.c_int(0)
    if status != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        raise EngineBuildError(f"no usable CUDA GPU here (cuInit returned {status}, {count.value} devices)")
    device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    cuda.cuDeviceGetName(name, len(name), device)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, device)
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)
    return f"{name.value.decode(errors='replace')} (sm_{major.value}{minor.value})"


def import_tensorrt(allow_version_mismatch: bool = False):
    try:
        import tensorrt as trt
    except ImportError:
        raise EngineBuildError(f"the TensorRT Python API is not installed: `make gpu-venv` installs "
                               f"{TENSORRT_REQUIREMENT}, the TensorRT of {SERVING_IMAGE}") from None
    if not same_release(trt.__version__, TENSORRT_VERSION) and not allow_version_mismatch:
        raise EngineBuildError(f"TensorRT {trt.__version__} is installed, but {SERVING_IMAGE} runs "
                               f"{TENSORRT_VERSION}: its engines would not load there (engines are tied to the "
                               "TensorRT version); pass --allow-version-mismatch for an engine used elsewhere")
    return trt


def _parse(trt, builder, logger, onnx_path: Path):
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = []
        for i in range(parser.num_errors):
            error = parser.get_error(i)
            errors.append(f"node {error.node_name() or error.node()} ({error.node_operator()}): {error.desc()}")
        raise EngineBuildError(f"TensorRT's ONNX parser refused {onnx_path}:\n  " + "\n  ".join(errors))
    return network, parser


def build_engine(onnx_path: Path, engine_path: Path, precision: str, profile: BatchProfile,
                 timing_cache: Path | None = None, allow_version_mismatch: bool = False,
                 workspace_mib: int = WORKSPACE_MIB) -> dict:
    """Build and write the engine (atomically) and its build report `<engine>.json`; returns the report."""
    if precision not in PRECISIONS:
        raise EngineBuildError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    model = onnx.load(str(onnx_path), load_external_data=False)
    blockers = tensorrt_blockers(model)
    if blockers:
        raise EngineBuildError(
            "this graph cannot go to TensorRT as it is:\n  " + "\n  ".join(map(str, blockers)) +
            "\nsplit it first: `s2t convert` lifts the string lookups into the feature spec (the adapter applies "
            "them in Python) and leaves the numeric core, which is what TensorRT takes")
    shapes = profile_shapes(model, profile)
    gpu = cuda_device()
    trt = import_tensorrt(allow_version_mismatch)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    if precision == "fp16":
        if not getattr(builder, "platform_has_fast_fp16", True):  # deprecated in TensorRT 10, still answered
            raise EngineBuildError(f"{gpu} has no fast FP16: build fp32")
        config.set_flag(trt.BuilderFlag.FP16)
    optimization = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        optimization.set_shape(name, low, opt, high)
    config.add_optimization_profile(optimization)
    # The timing cache keeps the kernel timings of earlier builds: a rebuild for another precision or profile
    # on the same GPU takes seconds instead of re-timing every tactic.
    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError("TensorRT could not build the engine (see its log above)")
    seconds = time.perf_counter() - started
    plan = bytes(serialized)
    write_atomically(engine_path, plan)
    if timing_cache:
        write_atomically(timing_cache, bytes(config.get_timing_cache().serialize()))
    report = {"engine": str(engine_path), "onnx": str(Path(onnx_path).resolve()),
              "onnx_sha256": hashlib.sha256(Path(onnx_path).read_bytes()).hexdigest(),
              "tensorrt": trt.__version__, "serving_image": SERVING_IMAGE, "gpu": gpu, "precision": precision,
              "profile": asdict(profile), "shapes": {k: [list(s) for s in v] for k, v in shapes.items()},
              "timing_cache": str(timing_cache) if timing_cache else None, "build_seconds": round(seconds, 2),
              "engine_bytes": len(plan)}
    write_atomically(report_path(engine_path), (json.dumps(report, indent=2) + "\n").encode())
    return report


def engine_precision(engine_path: Path) -> str:
    """The precision from the build report; an engine without one is treated as FP16 (the looser gate)."""
    report = report_path(engine_path)
    if report.is_file():
        return json.loads(report.read_text()).get("precision", "fp16")
    return "fp16"


def engine_batch_limit(engine_path: Path, default: int = 256) -> int:
    report = report_path(engine_path)
    if report.is_file():
        return int(json.loads(report.read_text())["profile"]["maximum"])
    return default


def use_wheel_cuda_runtime() -> None:
    """Polygraphy finds libcudart through LD_LIBRARY_PATH, read when it first needs it: add the wheels' dirs."""
    from s2t.models.gpu_libraries import ld_library_path
    os.environ["LD_LIBRARY_PATH"] = ld_library_path()


def engine_scores(engine_path: Path, categorical, numeric):
    """Score packed rows in-process with the engine (Polygraphy's TensorRT runner), in profile-sized batches."""
    import numpy as np
    use_wheel_cuda_runtime()
    try:
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    except ImportError:
        raise EngineBuildError("Polygraphy is not installed (it is one of .venv's pinned packages)") from None
    cuda_device()
    import_tensorrt(allow_version_mismatch=True)
    limit = engine_batch_limit(engine_path)
    parts = []
    with TrtRunner(EngineFromBytes(Path(engine_path).read_bytes())) as runner:
        for start in range(0, len(categorical), limit):
            outputs = runner.infer({"categorical": np.ascontiguousarray(categorical[start:start + limit]),
                                    "numeric": np.ascontiguousarray(numeric[start:start + limit])})
            parts.append(np.asarray(outputs["probability"], dtype=np.float32).ravel())
    return np.concatenate(parts)
