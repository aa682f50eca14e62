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

`Glue` is those jobs put together, each in its module: model_settings.py (ModelArgs, settings), responses.py,
batched_execute.py (`execute`, `batch`, Rows), decoupled_execute.py (`take_in`, `each_stream`, `outbox`),
bls_calls.py (`infer`, `stream`, FinishedStreams), kept_metrics.py (`metric_family`).

Nothing here imports Triton: the model passes its `triton_python_backend_utils` in, so backends/ stays importable
without a server and the glue is unit-tested through the wheel's own module (tests/unit/python_backend.py).
"""
from __future__ import annotations

import faulthandler
import gc

from s2t.backends.runtime import bytes_tensor
from s2t.backends.runtime.batched_execute import BatchedExecute, Rows
from s2t.backends.runtime.bls_calls import BlsCalls, FinishedStreams
from s2t.backends.runtime.decoupled_execute import DecoupledExecute
from s2t.backends.runtime.kept_metrics import CheckedMetric, KeptMetrics, MetricRefused
from s2t.backends.runtime.model_settings import ModelArgs, ModelSettings
from s2t.backends.runtime.responses import Responses

__all__ = ["Glue", "ModelArgs", "Rows", "FinishedStreams", "KeptMetrics", "CheckedMetric", "MetricRefused"]


class Glue(ModelSettings, Responses, BatchedExecute, DecoupledExecute, BlsCalls):
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


def _use_fast_bytes_codec(pb_utils) -> None:
    """The stub converts every BYTES tensor it builds or receives through `triton_python_backend_utils`'s
    `serialize_byte_tensor` / `deserialize_bytes_tensor`, looked up by name on each call; faster converters with the
    same results (backends/runtime/bytes_tensor.py) take their place once per stub (about 5 us of CPU per
    request)."""
    for name, faster in (("serialize_byte_tensor", bytes_tensor.stub_serializer),
                         ("deserialize_bytes_tensor", bytes_tensor.stub_deserializer)):
        wheel = getattr(pb_utils, name, None)
        if wheel is not None and not hasattr(wheel, "wheel"):
            setattr(pb_utils, name, faster(wheel))
