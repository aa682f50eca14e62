"""A python model's responses and inputs: an answer of named arrays, a new TritonError for every error response
(Triton 2.51 crashes when responses share one), INTERNAL without details after a logged traceback."""
from __future__ import annotations

import traceback
from typing import Mapping, Sequence

import numpy as np

from s2t.backends.runtime.serving_errors import InternalError, ServingError, triton_error


class Responses:
    """Glue's responses (it gives `pb`, `name` and `shown_as`)."""

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
