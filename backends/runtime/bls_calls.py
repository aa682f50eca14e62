"""BLS calls from a python model: another model's outputs called in-process, a decoupled callee's responses as a
stream, the callee's error mapped by its Triton code, and the finished streams held until the stub is done with them."""
from __future__ import annotations

import collections
import threading
import time
import traceback
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from s2t.backends.runtime.serving_errors import InternalError, from_triton_code

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


class BlsCalls:
    """Glue's BLS calls (it gives `pb`, `name` and `finished_streams`)."""

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
