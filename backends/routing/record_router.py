"""risk_router's whole batch without Triton: decode each request's records, route and score the valid rows
(router_core), decide the scored ones, and give each request either its rows' answers or one error.

A request is answered as a whole: a record that cannot be decoded fails its request (INVALID_ARG, the field named);
otherwise a row that could not be scored fails its request with the caller's own mistake first (a bad route), else
the first failure. The decision model and drift monitoring are callables, so that this runs in unit tests as it does
behind BLS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from s2t.backends.runtime.serving_errors import InvalidInput, ServingError, of_kind
from s2t.backends.records.record_decoder import RecordDecoder
from s2t.backends.runtime.serving_errors import request_error
from s2t.backends.runtime.request_rows import RequestRows
from s2t.backends.routing.router_core import BatchAnswer, Router

# probability [rows, 1] -> decision labels [rows, 1]; raises ServingError.
Decide = Callable[[np.ndarray], np.ndarray]
# categorical, numeric, probability and served_by ("model:version") of the scored rows.
WatchDrift = Callable[[np.ndarray, np.ndarray, np.ndarray, list], None]


@dataclass(frozen=True)
class RequestAnswer:
    error: ServingError | None = None
    probability: np.ndarray | None = None  # float32 [rows, 1]
    decision: np.ndarray | None = None  # object (bytes) [rows, 1]
    served_by: np.ndarray | None = None  # object (bytes "model:version") [rows, 1]


class RecordRouter:
    def __init__(self, decoder: RecordDecoder, router: Router, decide: Decide, decision_model: str,
                 watch_drift: WatchDrift | None = None):
        self.decoder, self.router, self.decide, self.decision_model = decoder, router, decide, decision_model
        self.watch_drift = watch_drift

    def answer(self, payloads: Sequence[np.ndarray], overrides: Sequence[object]) -> tuple[list[RequestAnswer],
                                                                                         BatchAnswer]:
        """One answer per request (`payloads[i]` its records, `overrides[i]` its `route`), and the batch's routing
        outcome (for metrics)."""
        rows = RequestRows.of(payloads)
        flat = rows.join(payloads)
        decoded = self.decoder.decode(flat)
        valid = [i for i, e in enumerate(decoded.errors) if e is None]
        owner = rows.owners()
        keys = [decoded.request_ids[i] or flat[i] for i in valid]
        batch = self.router.answer(decoded.categorical[valid], decoded.numeric[valid], keys,
                                   [overrides[owner[i]] for i in valid])
        scored = [k for k, e in enumerate(batch.errors) if e is None]
        decisions = np.empty((len(valid), 1), dtype=object)
        if scored:
            try:
                decisions[scored] = self.decide(batch.probability[scored])
            except ServingError as err:
                for k in scored:
                    batch.errors[k] = of_kind(err.kind, f"{self.decision_model}: {err.message}")
            if self.watch_drift is not None:
                self.watch_drift(decoded.categorical[valid][scored], decoded.numeric[valid][scored],
                                 batch.probability[scored], [batch.served_by[k] for k in scored])
        row_of = {i: k for k, i in enumerate(valid)}
        return [self._request_answer(decoded.errors[part], [row_of.get(i) for i in range(part.start, part.stop)],
                                     batch, decisions) for part in rows.slices], batch

    @staticmethod
    def _request_answer(record_errors, picked: list[int | None], batch: BatchAnswer, decisions) -> RequestAnswer:
        bad_record = request_error(record_errors)
        if bad_record:
            return RequestAnswer(InvalidInput(bad_record))
        failed = [batch.errors[k] for k in picked if batch.errors[k] is not None]
        if failed:
            first = next((e for e in failed if isinstance(e, InvalidInput)), failed[0])
            return RequestAnswer(of_kind(first.kind, "; ".join(sorted({e.message for e in failed}))))
        return RequestAnswer(None, batch.probability[picked], decisions[picked],
                             np.array([[batch.served_by[k].encode()] for k in picked], dtype=object))
