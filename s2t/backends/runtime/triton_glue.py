"""The glue between Triton's python backend and a model's pure logic, written once: what each model.py would
otherwise repeat (the pytriton idea of one generic model wrapper and a `@batch` that joins and splits, our way).

A model.py makes one `Glue(pb_utils, name)` and declares with it: its settings type (`SETTINGS`, which
`s2t check-config` reads from the file), how its requests become the arguments of a pure function and how the
function's results become responses. From here it gets the per-request error (a new TritonError for every response),
the catch-all around `execute` (traceback to the log, INTERNAL without details to each caller), the fault point
`<name>.execute`, joining a dynamic batch and splitting the answers, BLS calls with their error mapping, the decoupled
check and senders (each request of a decoupled model handled on its own, refused with its own error), the config
JSON read once and the settings read with unknown keys reported and file parameters resolved in the model's folders,
the metric families (`metric_family`: kept, never deleted, and refusing before it is sent an update Triton would
refuse), and `finalize(model)`, which rids the stub of every other Triton object before it ends.

Nothing here imports Triton: the model passes its `triton_python_backend_utils` in, so s2t/backends/ stays importable
without a server and the glue is unit-tested through the wheel's own module (tests/unit/python_backend.py).
"""
from __future__ import annotations

import collections
import ctypes
import dataclasses
import faulthandler
import functools
import gc
import json
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from s2t.backends.runtime import bytes_tensor, fault_points
from s2t.backends.runtime.decoupled_sender import Outbox, StreamSender
from s2t.backends.runtime.serving_errors import (InternalError, InvalidInput, ServingError, from_triton_code,
                                                 triton_error, request_error)
from s2t.backends.runtime.model_parameters import (MODEL_FOLDER, VERSION_FOLDER, ParameterError, read_parameters,
                                                   unknown_parameters)
from s2t.backends.runtime.request_rows import RequestRows


# How long a finished BLS stream's iterator is kept (see FinishedStreams): far past the stub's own clean-up of it,
# which comes a message round trip after the last response.
FINISHED_STREAM_HOLD_S = 10.0


class FinishedStreams:
    """Keeps the iterator of a finished decoupled BLS stream alive for a while, then drops it from a Python thread.

    Triton 2.51's stub keeps every response of such a stream in its ResponseIterator, and a map of its own holds
    the iterator until its clean-up thread erases the entry after the last response. When Python let go of the
    iterator first, that thread destroyed it, and with it the responses' numpy arrays, without the GIL: the
    interpreter's heap was corrupted and the stub died of a SIGSEGV later (in risk_explainer, some seconds into a
    burst of explanations). Held here until long after the erase, the iterator is destroyed by Python, with the
    GIL: whichever stream finishes next drops the ones past `hold_s`."""

    def __init__(self, hold_s: float = FINISHED_STREAM_HOLD_S, clock: Callable[[], float] = time.monotonic):
        self.hold_s, self.clock = hold_s, clock
        self._held: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def keep(self, iterator) -> None:
        now = self.clock()
        expired = []
        with self._lock:
            self._held.append((now, iterator))
            while self._held and now - self._held[0][0] > self.hold_s:
                expired.append(self._held.popleft())
        expired.clear()  # the last references go here, in this Python thread, outside the lock

    def __len__(self) -> int:
        return len(self._held)

    def release(self) -> None:
        """Drops every held iterator now (a model's finalize: the stub's map of them was emptied just before)."""
        with self._lock:
            held, self._held = self._held, collections.deque()
        held.clear()


COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# What Triton 2.51's server accepts of each kind of metric (core's metric_family.cc).
_ACCEPTS = {COUNTER: {"increment", "value"}, GAUGE: {"increment", "set", "value"}, HISTOGRAM: {"observe"}}


class MetricRefused(ValueError):
    """A metric update Triton would refuse, refused before it is sent."""


class KeptMetrics:
    """`pb_utils.MetricFamily` as a model's metric classes take it (called to make a family; COUNTER, GAUGE,
    HISTOGRAM): every family and metric made through it is kept for the life of the process and never deleted.

    Triton 2.51 cannot delete them safely either way. From the stub's teardown (the interpreter's last garbage
    collection, or the model object's end) the delete goes through the stub's state, already destroyed: the stub dies
    of a SIGSEGV at every unload. From a model's finalize it reaches the server, which shares one Prometheus metric
    among all families of a name and labels (the old and the new instance of a reloaded model) but counts references
    per family: the old instance's delete frees the metric the new one updates, and the server aborts on a corrupted
    heap. Kept, a replaced instance's series stay in the server's metrics with their last values (a new instance with
    the same labels counts on from them), and the server keeps its small objects for them until it exits."""

    def __init__(self, pb_utils):
        # Looked up when used: the stub sets pb_utils.MetricFamily only after model.py is imported.
        self._pb = pb_utils
        # One reference Python never gives back, so no teardown reaches the count of zero that deletes them.
        self._kept: list = []
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._kept))

    @property
    def COUNTER(self):  # noqa: N802 - MetricFamily's spelling
        return self._pb.MetricFamily.COUNTER

    @property
    def GAUGE(self):  # noqa: N802
        return self._pb.MetricFamily.GAUGE

    @property
    def HISTOGRAM(self):  # noqa: N802
        return self._pb.MetricFamily.HISTOGRAM

    def __call__(self, *args, **kwargs) -> "KeptFamily":
        kind = kwargs["kind"] if "kind" in kwargs else args[2]
        return KeptFamily(self.keep(self._pb.MetricFamily(*args, **kwargs)), self._kind_of(kind), self.keep)

    def keep(self, made):
        self._kept.append(made)
        return made

    def _kind_of(self, kind) -> str:
        family = self._pb.MetricFamily
        return {family.COUNTER: COUNTER, family.GAUGE: GAUGE, family.HISTOGRAM: HISTOGRAM}[kind]


class KeptFamily:
    """A MetricFamily made through KeptMetrics; the metrics it makes (Triton's own objects) are kept too, and
    handed out as CheckedMetrics."""

    __slots__ = ("_family", "_kind", "_keep")

    def __init__(self, family, kind: str, keep: Callable):
        self._family, self._kind, self._keep = family, kind, keep

    def Metric(self, *args, **kwargs) -> "CheckedMetric":  # noqa: N802 - the stub's spelling
        return CheckedMetric(self._keep(self._family.Metric(*args, **kwargs)), self._kind)


class CheckedMetric:
    """A Triton metric that refuses here, with MetricRefused, any update the server would refuse: an increment of
    a counter below zero (or NaN, which would stay in the counter), a set or observe the kind does not take.

    In Triton 2.51's python backend a refused update kills the stub: the server frees the error message it
    answers with as soon as the stub has woken, while the stub reads and frees it too. The double free corrupts the
    shared-memory pool, and one of the stub's next allocations dies of a SIGSEGV holding the pool's lock, on which
    the server then aborts (boost::interprocess::lock_exception).

    One thread at a time per metric: the stub's increment and observe let go of the GIL while they rewrite the
    metric's own copy in shared memory, so two threads updating one metric at once could free that copy twice."""

    __slots__ = ("_metric", "_kind", "_lock")

    def __init__(self, metric, kind: str):
        self._metric, self._kind = metric, kind
        self._lock = threading.Lock()

    def _check(self, operation: str) -> None:
        if operation not in _ACCEPTS[self._kind]:
            raise MetricRefused(f"a {self._kind} does not take {operation}")

    def increment(self, value) -> None:
        self._check("increment")
        if self._kind == COUNTER and not value >= 0:
            raise MetricRefused(f"a counter is incremented by a value of 0 or more, not {value}")
        with self._lock:
            self._metric.increment(value)

    def set(self, value) -> None:
        self._check("set")
        with self._lock:
            self._metric.set(value)

    def observe(self, value) -> None:
        self._check("observe")
        with self._lock:
            self._metric.observe(value)

    def value(self) -> float:
        self._check("value")
        with self._lock:
            return self._metric.value()


@dataclass(frozen=True)
class ModelArgs:
    """What Triton's `initialize(args)` says about the model, its config JSON parsed once."""

    config: dict
    name: str
    folder: Path
    version: str

    @classmethod
    def of(cls, args: Mapping[str, str]) -> "ModelArgs":
        return cls(json.loads(args["model_config"]), args["model_name"], Path(args["model_repository"]),
                   args["model_version"])

    @property
    def parameters(self) -> dict:
        return self.config.get("parameters", {})

    @property
    def version_dir(self) -> Path:
        return self.folder / self.version

    @property
    def repository(self) -> Path:
        """The model repository this model sits in (`model_repository` is the model's own folder)."""
        return self.folder.parent

    @property
    def folders(self) -> dict[str, Path]:
        """What the files a config names are relative to (s2t/backends/runtime/model_parameters.py `path_parameter`)."""
        return {MODEL_FOLDER: self.folder, VERSION_FOLDER: self.version_dir}

    def with_parameters(self, parameters: Mapping) -> "ModelArgs":
        """The same model with other parameters (a version's own settings over the config's)."""
        return dataclasses.replace(self, config={**self.config, "parameters": dict(parameters)})


@dataclass(frozen=True)
class Rows:
    """A batched function's results over the joined rows: outputs by name, and optionally each row's decoding
    error (None for a good row); a request with a bad row is answered INVALID_ARG naming it, its batch-mates not."""

    outputs: Mapping[str, np.ndarray]
    errors: Sequence | None = None


class Glue:
    """The python backend's side of one model. `name` opens its error messages and names its fault point."""

    def __init__(self, pb_utils, name: str, shown_as: str | None = None):
        self.pb, self.name, self.shown_as = pb_utils, name, shown_as or name
        self.finished_streams = FinishedStreams()
        # What a model's metric classes get for pb_utils.MetricFamily (see KeptMetrics).
        self.metric_family = KeptMetrics(pb_utils)
        # A stub that dies of a signal (a crash in native code) otherwise leaves nothing in the server's log: this
        # writes every thread's Python stack to the stub's stderr, which is that log.
        faulthandler.enable(all_threads=True)
        _use_fast_bytes_codec(pb_utils)

    def finalize(self, model) -> None:
        """The end of every model's `finalize`, once its threads are stopped: the Triton objects (requests, tensors,
        responses, BLS streams) that `model`, the glue or any reference cycle still holds are deleted now, while the
        stub can. After finalize the stub destroys its shared memory and then ends the interpreter, whose last garbage
        collection deletes what is left through that memory: a SIGSEGV. Cycles are common: an error kept in a local
        (`last_error = err`) holds its traceback, whose frames hold the request being served."""
        self.finished_streams.release()
        vars(model).clear()
        gc.collect()

    # --- configuration ---------------------------------------------------------------------------------------
    def settings(self, cls: type, args: ModelArgs, error: type[ValueError] = ParameterError, strict: bool = True,
                 **given) -> Any:
        """`cls` read from the config's parameters, the files they name resolved in the model's folders; with
        `strict`, keys it does not read are logged (a typo there keeps a default silently; `s2t check-config`
        refuses them before a server starts)."""
        if strict:
            self.report_unknown(args, cls)
        return read_parameters(cls, args.parameters, error, args.folders, **given)

    def report_unknown(self, args: ModelArgs, *classes: type) -> list[str]:
        """Logs the keys none of `classes` reads (for a model whose parameters fill several settings types)."""
        unknown = sorted(set.intersection(*(set(unknown_parameters(cls, args.parameters)) for cls in classes)))
        if unknown:
            self.pb.Logger.log_warn(f"{self.name}: parameters {', '.join(unknown)} are not ones it reads")
        return unknown

    def require_decoupled(self, args: ModelArgs, why: str) -> None:
        if not self.pb.using_decoupled_model_transaction_policy(args.config):
            raise ValueError(f"{self.name} {why}: its config must set model_transaction_policy {{ decoupled: true }}")

    # --- responses -------------------------------------------------------------------------------------------
    def error(self, err: ServingError):
        # A new TritonError for every response: Triton 2.51 crashes when responses share one.
        return self.pb.InferenceResponse(error=triton_error(err, self.pb.TritonError))

    def internal_error(self):
        return self.error(InternalError(f"{self.shown_as}: internal error"))

    def answer(self, outputs: Mapping[str, np.ndarray]):
        return self.pb.InferenceResponse(output_tensors=[self.pb.Tensor(n, a) for n, a in outputs.items()])

    def input(self, request, name: str) -> np.ndarray:
        return self.pb.get_input_tensor_by_name(request, name).as_numpy()

    def inputs(self, request, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The optional inputs among `names` that the request carries."""
        tensors = {name: self.pb.get_input_tensor_by_name(request, name) for name in names}
        return {name: tensor.as_numpy() for name, tensor in tensors.items() if tensor is not None}

    def flag(self, request, name: str) -> bool:
        """An optional BOOL control input (a sequence's START / END): absent is False."""
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return tensor is not None and bool(tensor.as_numpy().ravel()[0])

    def _failed(self, requests) -> list:
        self.pb.Logger.log_error(traceback.format_exc())
        return [self.internal_error() for _ in requests]

    # --- execute ---------------------------------------------------------------------------------------------
    def execute(self, handler: Callable) -> Callable:
        """`execute(self, requests)` with the fault point and the catch-all: any exception is logged and every
        request of the call is answered INTERNAL without the details; the server keeps serving."""
        point = f"{self.name}.execute"

        @functools.wraps(handler)
        def execute(model, requests):
            try:
                fault_points.check(point)
                return handler(model, requests)
            except Exception:  # noqa: BLE001 - log it, fail these requests, keep serving
                return self._failed(requests)
        return execute

    def batch(self, *inputs: str, ravel: bool = False) -> Callable:
        """`fn(self, *joined_inputs) -> Rows` served as `execute`: the named inputs of every request of the dynamic
        batch joined into one array each (flattened with `ravel`), the results split back by request."""
        def wrap(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def execute(model, requests):
                tensor_of = self.pb.get_input_tensor_by_name
                arrays = [[tensor_of(r, name).as_numpy() for r in requests] for name in inputs]
                if ravel:
                    arrays = [[a.ravel() for a in per_request] for per_request in arrays]
                rows = RequestRows.of(arrays[0])
                return self._split(rows, fn(model, *[rows.join(a) for a in arrays]))
            return self.execute(execute)
        return wrap

    def _split(self, rows: RequestRows, result: Rows) -> list:
        """One response per request, in order. This loop runs once per request and is the largest Python cost of a
        stub at one record per request, so per request it makes only the tensors and the response."""
        response, tensor = self.pb.InferenceResponse, self.pb.Tensor
        names, arrays = list(result.outputs), list(result.outputs.values())
        if not arrays:
            parts = [()] * len(rows.slices)
        elif rows.total == len(rows.slices):
            # One row per request (the common case): numpy's own iteration over [requests, 1, ...] gives each
            # request's row as a view, with no slice object per request and output.
            parts = zip(*(array.reshape(len(array), 1, *array.shape[1:]) for array in arrays))
        else:
            parts = zip(*(rows.split(array) for array in arrays))
        errors = result.errors
        if errors is None or all(e is None for e in errors):
            return [response(output_tensors=[tensor(n, a) for n, a in zip(names, part)]) for part in parts]
        responses = []
        for part, request_rows in zip(parts, rows.slices):
            message = request_error(errors[request_rows])
            if message:
                responses.append(self.error(InvalidInput(message)))
            else:
                responses.append(response(output_tensors=[tensor(n, a) for n, a in zip(names, part)]))
        return responses

    # --- decoupled -------------------------------------------------------------------------------------------
    def take_in(self, requests, take: Callable[[list], Any]) -> tuple[bool, Any]:
        """For a decoupled model: `take(senders)` with the fault point; if it fails, before any record was taken in,
        every request gets an INTERNAL error as its final response. (taken, take's result)."""
        senders = [r.get_response_sender() for r in requests]
        try:
            fault_points.check(f"{self.name}.execute")
            return True, take(senders)
        except Exception:  # noqa: BLE001 - log it, answer every request, keep serving
            for sender, response in zip(senders, self._failed(requests)):
                sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return False, None

    def send(self, sender, response, final: bool) -> None:
        sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def outbox(self) -> Outbox:
        """The one thread that sends a decoupled model's responses (Triton 2.51 aborts the server when several
        threads send at once)."""
        return Outbox(self.pb.Logger.log_error, f"{self.name}-outbox")

    def each_stream(self, refuse: Callable[[Any, StreamSender, ServingError], None]) -> Callable:
        """`handle(self, request, sender)` served as a decoupled model's `execute`: each request of the call with
        its own StreamSender, which `handle` (or the work it starts) closes. A ServingError raised for a request is
        its answer, given to `refuse(self, sender, err)` (the model sends it from its outbox and counts it); any
        other exception, the fault point included, is logged and refused as INTERNAL without the details. Either
        way the next request is still taken."""
        point = f"{self.name}.execute"

        def wrap(handle: Callable) -> Callable:
            @functools.wraps(handle)
            def execute(model, requests):
                for request in requests:
                    sender = StreamSender(request.get_response_sender(), self.pb)
                    try:
                        fault_points.check(point)
                        handle(model, request, sender)
                    except ServingError as err:
                        refuse(model, sender, err)
                    except Exception:  # noqa: BLE001 - log it, refuse this request alone, keep serving
                        self.pb.Logger.log_error(traceback.format_exc())
                        refuse(model, sender, InternalError(f"{self.shown_as}: internal error"))
                return None
            return execute
        return wrap

    # --- BLS -------------------------------------------------------------------------------------------------
    def infer(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], version: int = -1,
              failure: str | None = None) -> list[np.ndarray]:
        """`model`'s `outputs` for `inputs`, called in-process. Its error comes back as the caller's error kind
        (by Triton code, never by text); a failure of the call itself is logged and raised as InternalError
        (`<name>: <failure>`) without the details."""
        response = self._exec(model, inputs, outputs, version, failure, decoupled=False)
        self._raise_error_of(response)
        return [self.pb.get_output_tensor_by_name(response, name).as_numpy() for name in outputs]

    def stream(self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], version: int = -1,
               failure: str | None = None) -> Iterator[list[np.ndarray | None]]:
        """A decoupled model's responses to one BLS request, each as its `outputs` (None for an output a response
        lacks, as the last one, which only closes the stream, does); errors as `infer` raises them."""
        responses = self._exec(model, inputs, outputs, version, failure, decoupled=True)
        for response in responses:
            self._raise_error_of(response)
            tensors = [self.pb.get_output_tensor_by_name(response, name) for name in outputs]
            yield [None if tensor is None else tensor.as_numpy() for tensor in tensors]
        # Only a stream read to its end: letting go of an unfinished iterator makes the stub read the rest first,
        # which must stay on the thread that gave it up rather than land on another stream's.
        self.finished_streams.keep(responses)

    def _exec(self, model, inputs, outputs, version, failure, decoupled: bool):
        request = self.pb.InferenceRequest(
            model_name=model, model_version=version, requested_output_names=list(outputs),
            inputs=[self.pb.Tensor(name, array) for name, array in inputs.items()])
        try:
            return request.exec(decoupled=True) if decoupled else request.exec()
        except Exception:  # noqa: BLE001 - the stub's own failure: log it, answer the rows with an error
            self.pb.Logger.log_error(traceback.format_exc())
            raise InternalError(f"{self.name}: {failure or f'internal error calling {model}'}") from None

    def _raise_error_of(self, response) -> None:
        if response.has_error():
            error = response.error()
            raise from_triton_code(error.code(), error.message(), self.pb.TritonError)


def _use_fast_bytes_codec(pb_utils) -> None:
    """The stub converts every BYTES tensor it builds or receives through `triton_python_backend_utils`'s
    `serialize_byte_tensor` / `deserialize_bytes_tensor`, looked up by name on each call; faster converters with the
    same results (s2t/backends/runtime/bytes_tensor.py) take their place once per stub (about 5 us of CPU per
    request)."""
    for name, faster in (("serialize_byte_tensor", bytes_tensor.stub_serializer),
                         ("deserialize_bytes_tensor", bytes_tensor.stub_deserializer)):
        wheel = getattr(pb_utils, name, None)
        if wheel is not None and not hasattr(wheel, "wheel"):
            setattr(pb_utils, name, faster(wheel))
