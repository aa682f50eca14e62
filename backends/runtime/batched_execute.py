"""A python model's `execute`: the fault point and the catch-all around it, and `batch`, which joins a dynamic
batch's inputs into arrays for a pure function and splits its results back, a bad row failing its own request."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from s2t.backends.runtime import fault_points
from s2t.backends.runtime.serving_errors import InvalidInput, request_error
from s2t.backends.runtime.request_rows import RequestRows


@dataclass(frozen=True)
class Rows:
    """A batched function's results over the joined rows: outputs by name, and optionally each row's decoding
    error (None for a good row); a request with a bad row is answered INVALID_ARG naming it, its batch-mates not."""

    outputs: Mapping[str, np.ndarray]
    errors: Sequence | None = None


class BatchedExecute:
    """Glue's `execute` wrappers (it gives `pb`, `name`, `error` and `_failed`)."""

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
