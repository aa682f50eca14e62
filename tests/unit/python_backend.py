"""A model.py driven without a server, as pytriton's own unit tests do: the wheel's `triton_python_backend_utils`
(its pure-Python half: tensor look-ups, config helpers) with small stand-ins for the part the stub implements in C++
(Tensor, InferenceRequest, InferenceResponse, TritonError, Logger, MetricFamily). BLS calls go to Python callables
the test gives, so a model's glue is checked on its own; tests/integration checks the same models in a server."""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import types
from pathlib import Path
from typing import Callable

import numpy as np

WHEEL_UTILS = (Path(importlib.util.find_spec("pytriton").origin).parent
               / "tritonserver" / "backends" / "python" / "triton_python_backend_utils.py")
ROOT = Path(__file__).resolve().parents[2]


class TritonError(Exception):
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = INTERNAL):
        super().__init__(message)
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    # The module whose `serialize_byte_tensor` a BYTES tensor goes through when it is built: the stub looks it up by
    # name on `triton_python_backend_utils` for every BYTES tensor (set by backend_utils()).
    utils: types.ModuleType | None = None

    def __init__(self, name: str, array):
        self._name, self._array = name, np.asarray(array)
        if Tensor.utils is not None and (self._array.dtype == np.object_ or self._array.dtype.type == np.bytes_):
            self.serialized = Tensor.utils.serialize_byte_tensor(self._array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors=(), error: TritonError | None = None):
        self._outputs, self._error = list(output_tensors), error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output(self, name: str) -> np.ndarray:
        return next(t.as_numpy() for t in self._outputs if t.name() == name)


TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class ResponseSender:
    """What a decoupled model sends for one request: (response or None, flags), in order."""

    def __init__(self):
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.done = threading.Event()

    def send(self, response=None, flags: int = 0):
        if self.done.is_set():
            raise RuntimeError("a response was sent after the final one")
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


class InferenceRequest:
    """A client's request (inputs, JSON parameters, a sequence's correlation id) or, built by a model, a BLS request
    that `exec` sends to `InferenceRequest.bls[model_name]`."""

    bls: dict[str, Callable[["InferenceRequest"], InferenceResponse]] = {}

    def __init__(self, inputs=(), parameters: dict | str | None = None, model_name: str = "", model_version: int = -1,
                 requested_output_names=(), correlation_id: int | str = 0):
        self._inputs = list(inputs)
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})
        self.model_name, self.model_version = model_name, model_version
        self.requested_output_names = list(requested_output_names)
        self._correlation_id = correlation_id
        self.sender = ResponseSender()

    def correlation_id(self):
        return self._correlation_id

    def request_id(self) -> str:
        return ""  # the client sent no id

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def parameters(self) -> str:
        return self._parameters

    def exec(self, decoupled: bool = False):
        """The model's answer; with `decoupled`, an iterator of its responses (the stand-in returns one)."""
        return InferenceRequest.bls[self.model_name](self)

    def is_cancelled(self) -> bool:
        return False


class Logger:
    lines: list[tuple[str, str]] = []

    @classmethod
    def log_error(cls, text):
        cls.lines.append(("error", text))

    @classmethod
    def log_warn(cls, text):
        cls.lines.append(("warn", text))

    @classmethod
    def log_info(cls, text):
        cls.lines.append(("info", text))

    log_verbose = log_info


class Metric:
    def __init__(self, labels):
        self.labels, self._value, self.observed = dict(labels), 0.0, []

    def increment(self, amount):
        self._value += amount

    def set(self, value):
        self._value = value

    def observe(self, value):
        self.observed.append(value)

    def value(self):
        return self._value


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    families: dict[str, "MetricFamily"] = {}

    def __init__(self, name, description, kind):
        self.name, self.description, self.kind, self.metrics = name, description, kind, []
        MetricFamily.families[name] = self

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the stub's spelling
        metric = Metric(labels or {})
        self.metrics.append(metric)
        return metric


def backend_utils() -> types.ModuleType:
    """The wheel's triton_python_backend_utils with the stub's classes filled in, fresh for each test."""
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", WHEEL_UTILS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    InferenceRequest.bls, Logger.lines, MetricFamily.families = {}, [], {}
    for cls in (TritonError, Tensor, InferenceRequest, InferenceResponse, Logger, MetricFamily):
        setattr(module, cls.__name__, cls)
    module.TRITONSERVER_RESPONSE_COMPLETE_FINAL = TRITONSERVER_RESPONSE_COMPLETE_FINAL
    Tensor.utils = module
    return module


def load_model(model_py: Path, pb_utils: types.ModuleType):
    """`model_py`'s TritonPythonModel class, imported with `pb_utils` as its triton_python_backend_utils."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    try:
        spec = importlib.util.spec_from_file_location(f"model_under_test_{abs(hash(model_py))}", model_py)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        del sys.modules["triton_python_backend_utils"]
    return module.TritonPythonModel


def initialize(model_class, model_dir: Path, version: str = "1", config: dict | None = None):
    """An instance initialized as Triton does, with the model folder's config.pbtxt as JSON (or `config`)."""
    if config is None:
        from google.protobuf import json_format

        from s2t.triton_config import load
        config = json_format.MessageToDict(load(model_dir), preserving_proto_field_name=True)
    model = model_class()
    model.initialize({"model_config": json.dumps(config), "model_repository": str(model_dir),
                      "model_version": version, "model_name": model_dir.name, "model_instance_kind": "CPU",
                      "model_instance_name": f"{model_dir.name}_0", "model_instance_device_id": "0"})
    return model


def request(parameters: dict | None = None, correlation_id: int | str = 0, **inputs) -> InferenceRequest:
    return InferenceRequest([Tensor(name, value) for name, value in inputs.items()], parameters,
                            correlation_id=correlation_id)


def payloads(*records) -> np.ndarray:
    return np.array([[r if isinstance(r, bytes) else json.dumps(r).encode()] for r in records], dtype=object)
