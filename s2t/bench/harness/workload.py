"""The records every load generator sends: real German Credit rows as legacy JSON records, in each wire form.

One list of records feeds perf_analyzer (KServe v2 inputs), wrk (Triton's JSON body and the baseline's bare
record), locust and the in-process baseline, so every side scores the same rows in the same order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from s2t.backends.records.record_decoder import RecordDecoder
from s2t.models import dataset


@dataclass(frozen=True)
class Workload:
    records: tuple[dict, ...]

    @classmethod
    def load(cls, data_csv: Path) -> "Workload":
        rows = dataset.load(Path(data_csv)).records()
        return cls(tuple({"request_id": f"r-{i}", "features": f} for i, f in enumerate(rows)))

    def payloads(self) -> list[bytes]:
        return [json.dumps(r).encode() for r in self.records]



def pack(decoder: RecordDecoder, payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The scorer's two inputs for every record, as skill_adapter would produce them."""
    decoded = decoder.decode(payloads)
    if any(decoded.errors):
        raise ValueError(f"German Credit rows that do not decode: {[e for e in decoded.errors if e][:3]}")
    return decoded.categorical, decoded.numeric


def triton_json_body(payload: bytes) -> str:
    """The KServe v2 JSON body of risk_pipeline for one record (one BYTES element), as curl sends it."""
    return json.dumps({"inputs": [{"name": "payload", "shape": [1, 1], "datatype": "BYTES",
                                   "data": [payload.decode()]}]})


def perf_input_pipeline(payloads: list[bytes]) -> dict:
    """perf_analyzer --input-data: one batch-1 entry per record; with -b N it takes N consecutive entries."""
    return {"data": [{"payload": {"content": [p.decode()], "shape": [1]}} for p in payloads]}


def perf_input_scorer(categorical: np.ndarray, numeric: np.ndarray) -> dict:
    return {"data": [{"categorical": {"content": c.tolist(), "shape": [c.size]},
                      "numeric": {"content": n.tolist(), "shape": [n.size]}}
                     for c, n in zip(categorical, numeric)]}
