"""The rows of several requests joined into one batch, and split back: Triton's dynamic batcher hands a python model
a list of requests, and the work is cheapest over all their rows at once."""
from __future__ import annotations

from typing import Sequence

import numpy as np


class RequestRows:
    """Where each request's rows sit in the joined batch."""

    def __init__(self, counts: Sequence[int]):
        self.slices: list[slice] = []
        start = 0
        for count in counts:
            self.slices.append(slice(start, start + count))
            start += count
        self.total = start

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> "RequestRows":
        return cls([len(a) for a in arrays])

    @staticmethod
    def join(arrays: Sequence[np.ndarray]) -> np.ndarray:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def owners(self) -> np.ndarray:
        """The request each row of the joined batch belongs to."""
        return np.repeat(np.arange(len(self.slices)), [s.stop - s.start for s in self.slices])

    def split(self, joined: Sequence) -> list:
        """Each request's part of `joined` (views, for arrays)."""
        return [joined[s] for s in self.slices]
