"""Triton model configs (config.pbtxt) read with Triton's own protobuf schema.

The one reader of the project's configs: every layer of `s2t` reads configs through it, so it imports nothing else
of `s2t`. Checking a config against what it serves is the gate's job (`s2t/gate/model_config.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from s2t.backends.scoring.decision_policy import Thresholds
from s2t.backends.runtime.model_parameters import read_parameters


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
