"""Score legacy records on risk_pipeline with tritonclient, over HTTP or gRPC.

    python -m s2t.clients.risk_client clients/examples/record.json --url localhost:8000
    python -m s2t.clients.risk_client records.jsonl --url localhost:8001 --protocol grpc
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from s2t.wire.names import DECISION, PAYLOAD, PROBABILITY

MODEL = "risk_pipeline"


@dataclass(frozen=True)
class Score:
    request_id: str | None
    probability: float
    decision: str


def score(records: Sequence[dict], url: str = "localhost:8000", protocol: str = "http") -> list[Score]:
    """One request carrying every record as a row of the batch; Triton's batcher merges concurrent callers."""
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    payload = np.array([json.dumps(r).encode() for r in records], dtype=object).reshape(-1, 1)
    tensor = client.InferInput(PAYLOAD, list(payload.shape), "BYTES")
    tensor.set_data_from_numpy(payload)
    triton = client.InferenceServerClient(url)
    try:
        result = triton.infer(MODEL, [tensor])
    finally:
        triton.close()
    probability, decision = result.as_numpy(PROBABILITY).ravel(), result.as_numpy(DECISION).ravel()
    return [Score(r.get("request_id"), float(p), d.decode()) for r, p, d in zip(records, probability, decision)]


def score_payload(payload: bytes, url: str = "localhost:8000", protocol: str = "http", model: str = MODEL,
                  timeout_s: float = 60.0) -> tuple[float, str]:
    """One record's bytes sent as they are, so that the server's decoder alone judges them: (probability, decision).
    An invalid record raises the server's InferenceServerException, which names the field."""
    if protocol == "grpc":
        import tritonclient.grpc as client
    else:
        import tritonclient.http as client
    tensor = client.InferInput("payload", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
    if protocol == "grpc":
        triton = client.InferenceServerClient(url)
        call = {"client_timeout": timeout_s}
    else:
        triton = client.InferenceServerClient(url, network_timeout=timeout_s)
        call = {}
    try:
        result = triton.infer(model, [tensor], **call)
    finally:
        triton.close()
    return float(result.as_numpy("probability").ravel()[0]), result.as_numpy("decision").ravel()[0].decode()


def _read(path: Path) -> list[dict]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    loaded = json.loads(text)
    return loaded if isinstance(loaded, list) else [loaded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path, help="a JSON record, a JSON list of records, or JSON lines")
    parser.add_argument("--url", default="localhost:8000")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    args = parser.parse_args()
    for s in score(_read(args.records), args.url, args.protocol):
        print(f"{s.request_id}\t{s.probability:.6f}\t{s.decision}")


if __name__ == "__main__":
    main()
