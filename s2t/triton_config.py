"""Triton model configs (config.pbtxt) read with Triton's own protobuf schema.

The one reader of the project's configs: every layer of `s2t` reads configs through it, so it imports nothing else
of `s2t`. Checking a config against what it serves is the gate's job (`s2t/gate/model_config.py`).
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from google.protobuf import text_format

from s2t.backends.runtime.model_parameters import read_parameters

if TYPE_CHECKING:
    from s2t.backends.scoring.decision_policy import Thresholds

SCHEMA_MODULE = "tritonclient.grpc.model_config_pb2"


def _schema():
    """Triton's config schema, the wheel's generated module, loaded on its own: importing it through
    `tritonclient.grpc` first runs that package (gRPC, numpy: most of an operator command's start). Registered under
    its own name, so that a later import of the package finds it and the schema is defined once."""
    if SCHEMA_MODULE in sys.modules:
        return sys.modules[SCHEMA_MODULE]
    package = importlib.util.find_spec("tritonclient")
    path = Path(package.submodule_search_locations[0]) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(SCHEMA_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[SCHEMA_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[SCHEMA_MODULE]
        raise
    return module


mc = _schema()


# Backends whose models are a model.py of ours: the python backend's (a stub process per instance) and the
# in-process one (native/python_inprocess.cc: the model's Python inside the server process).
INPROCESS_BACKEND = "s2t_inprocess"
MODEL_PY_BACKENDS = ("python", INPROCESS_BACKEND)


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]


def load(model_dir: Path) -> mc.ModelConfig:
    path = Path(model_dir) / "config.pbtxt"
    return load_text(path.read_text(), str(path))


def load_text(text: str, where: str = "config") -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ValueError(f"{where}: {err}") from None
    return config


def backend_parameters(config: mc.ModelConfig) -> dict[str, dict[str, str]]:
    """The config's parameters in the form the python backend hands them to a model (the config as JSON)."""
    return {key: {"string_value": value.string_value} for key, value in config.parameters.items()}


def decision_thresholds(model_dir: Path) -> Thresholds:
    """The thresholds a deciding model (risk_pipeline, risk_decision) serves with, read from its config."""
    from s2t.backends.scoring.decision_policy import Thresholds
    return read_parameters(Thresholds, backend_parameters(load(Path(model_dir))))


def tensors(entries: Iterable) -> dict[str, Tensor]:
    return {t.name: Tensor(t.name, mc.DataType.Name(t.data_type), tuple(t.dims)) for t in entries}


def is_engine(config: mc.ModelConfig) -> bool:
    return config.platform == "tensorrt_plan" or config.backend == "tensorrt"


def is_onnx(config: mc.ModelConfig) -> bool:
    return config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"


def model_filename(config: mc.ModelConfig) -> str:
    """The file each version folder holds for an ONNX or TensorRT model, as Triton looks for it."""
    return config.default_model_filename or ("model.plan" if is_engine(config) else "model.onnx")


def engine_report_path(engine_path: Path) -> Path:
    """The build report `s2t build-trt` writes beside an engine: what it was built for, readable without a GPU."""
    return Path(engine_path).with_name(Path(engine_path).name + ".json")
