"""The glue between the in-process backend (native/python_inprocess.cc) and a model's pure logic.

The python backend runs each model in a stub process and moves every request and every response across the
process boundary on its own: at one record per request that machinery, and the thread hand-offs around it, cost
more than the decode, the score and the decision together. The in-process backend runs a model's Python in the
server process instead: it hands this module the input tensors of a whole dynamic batch (BYTES as a list of
`bytes`, other types raw) and the row count of each request, and takes back the raw output tensors and each
request's error, building the responses itself.

A model for it is a `model.py` in its version folder with a class `InProcessModel(args: ModelArgs)`: `INPUTS` names
the inputs it reads, `execute(*joined)` takes each one joined over the batch (BYTES as a list of `bytes`, others
as arrays) and returns `Rows` (outputs by name, and each row's error or None), as the python backend's `Glue.batch`
models do. A request with a bad row is answered INVALID_ARG naming it, its batch-mates normally; any exception is
logged here and every request of the batch answered INTERNAL without the details; the server keeps serving. A
request whose inputs the backend cannot read (one missing, a BYTES buffer that does not parse) never gets here: the
backend answers it INVALID_ARG on its own and calls this with its batch-mates.

Nothing here imports Triton: the backend calls `load` and `Handler.execute` with plain Python values.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from s2t.backends.runtime import bytes_tensor, fault_points
from s2t.backends.runtime.serving_errors import (INTERNAL, INVALID, UNAVAILABLE, InternalError, InvalidInput,
                                                 ServingError, request_error)
from s2t.backends.runtime.model_parameters import ParameterError, read_parameters, unknown_parameters
from s2t.backends.runtime.request_rows import RequestRows
from s2t.backends.runtime.triton_glue import ModelArgs, Rows

# Triton's data type codes (TRITONSERVER_DataType) and error codes (TRITONSERVER_Error_Code).
BYTES = 13
TRITON_TYPES = {np.dtype(np.bool_): 1, np.dtype(np.uint8): 2, np.dtype(np.uint16): 3, np.dtype(np.uint32): 4,
                np.dtype(np.uint64): 5, np.dtype(np.int8): 6, np.dtype(np.int16): 7, np.dtype(np.int32): 8,
                np.dtype(np.int64): 9, np.dtype(np.float16): 10, np.dtype(np.float32): 11,
                np.dtype(np.float64): 12}
NUMPY_TYPES = {code: dtype for dtype, code in TRITON_TYPES.items()}
ERROR_CODES = {INVALID: 3, UNAVAILABLE: 4, INTERNAL: 1}
MODEL_FILE = "model.py"
_loads = itertools.count()


def log(level: str, message: str) -> None:
    """To the server's log (the backend's standard error), one line per message."""
    print(f"{level} {message}", file=sys.stderr, flush=True)


class InProcessGlue:
    """What a model.py for the in-process backend declares with: its settings and its log."""

    def __init__(self, name: str):
        self.name = name

    def settings(self, cls: type, args: ModelArgs, error: type[ValueError] = ParameterError) -> Any:
        unknown = unknown_parameters(cls, args.parameters)
        if unknown:
            log("W", f"{self.name}: parameters {', '.join(sorted(unknown))} are not ones it reads")
        return read_parameters(cls, args.parameters, error, args.folders)

    def log_info(self, message: str) -> None:
        log("I", message)


@dataclass(frozen=True)
class Output:
    """One output over the whole batch, raw: Triton's type code, the shape after the batch dimension, the bytes."""

    name: str
    datatype: int
    shape: tuple[int, ...]
    raw: bytes


def load(config_json: str, name: str, folder: str, version: int) -> "Handler":
    """The model in `<folder>/<version>/model.py`, made from its config (each load its own module: a reload
    of the same model must not reuse the previous code)."""
    args = ModelArgs(json.loads(config_json), name, Path(folder), str(version))
    path = args.version_dir / MODEL_FILE
    spec = importlib.util.spec_from_file_location(f"s2t_inprocess_{name}_{version}_{next(_loads)}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{name}: no {MODEL_FILE} in {args.version_dir}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Handler(module.InProcessModel(args), name)


def joined_input(datatype: int, shape: Sequence[int], data: bytes | list[bytes]) -> list[bytes] | np.ndarray:
    """One input over the batch: BYTES as its elements (the backend hands them over as a list), any other type
    as an array of `shape` over its raw bytes."""
    if datatype == BYTES:
        return data if isinstance(data, list) else bytes_tensor.decode(data)
    return np.frombuffer(data, dtype=NUMPY_TYPES[datatype]).reshape(shape)


def raw_output(name: str, array: np.ndarray) -> Output:
    array = np.asarray(array)
    if array.dtype == np.object_:
        return Output(name, BYTES, array.shape[1:], bytes_tensor.encode(array.ravel().tolist()))
    return Output(name, TRITON_TYPES[array.dtype], array.shape[1:], np.ascontiguousarray(array).tobytes())


class Handler:
    """One loaded model: a batch's raw inputs and each request's row count in; raw outputs and each request's
    error out, never an exception."""

    def __init__(self, model, name: str):
        self.model, self.name = model, name
        self.inputs = tuple(model.INPUTS)
        self._fault_point = f"{name}.execute"

    def execute(self, inputs: Mapping[str, tuple[int, Sequence[int], bytes | list[bytes]]], request_rows: Sequence[int]
                ) -> tuple[list[Output], list[tuple[int, str] | None]]:
        try:
            fault_points.check(self._fault_point)
            rows = RequestRows(request_rows)
            result: Rows = self.model.execute(*(joined_input(*inputs[name]) for name in self.inputs))
            outputs = [raw_output(name, array) for name, array in result.outputs.items()]
            if result.errors is None or all(e is None for e in result.errors):
                return outputs, [None] * len(rows.slices)
            return outputs, [_error(InvalidInput(message)) if (message := request_error(result.errors[s])) else None
                             for s in rows.slices]
        except ServingError as err:
            return [], [_error(err)] * len(request_rows)
        except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
            log("E", f"{self.name}: {traceback.format_exc()}")
            return [], [_error(InternalError(f"{self.name}: internal error"))] * len(request_rows)


def _error(err: ServingError) -> tuple[int, str]:
    return ERROR_CODES[err.kind], err.message
