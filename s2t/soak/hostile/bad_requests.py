"""The requests a careless caller sends risk_pipeline, built from a valid record, and how their answers are counted:
an invalid record must be refused (HTTP 400, gRPC INVALID_ARGUMENT) with a message naming the field at fault, and
the valid requests sent beside it must be scored. Plain bytes and strings here, no clients, so that the builders and
the counting are tested on tables.
"""
from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES, MAX_ID_CHARS

# Every way of getting a record wrong that the soak sends, in the order they take turns.
INVALID_KINDS = ("missing_feature", "wrong_type", "not_json", "over_64_kib", "long_request_id")
# A fifth of a caller's requests are invalid: one in every INVALID_EVERY.
INVALID_EVERY = 5
# The answers that refuse a caller's request as the caller's error.
REFUSALS = frozenset({"HTTP 400", "INVALID_ARGUMENT"})
ANSWERED_OK = frozenset({"HTTP 200", "OK"})
PROTOCOLS = ("http", "grpc")
UNEXPECTED_SHOWN = 5
VALID = "valid"
MALFORMED_BYTES = "malformed_bytes"


@dataclass(frozen=True)
class BadRecord:
    kind: str
    payload: bytes
    field: str  # what the refusal must name


def _numeric_feature(features: Mapping[str, object]) -> str:
    return next(name for name, value in features.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool))


def bad_record(kind: str, features: Mapping[str, object], request_id: str) -> BadRecord:
    """A record that is wrong in the way `kind` names, and otherwise `features` as given."""
    envelope = {"request_id": request_id, "features": dict(features)}
    if kind == "missing_feature":
        name = _numeric_feature(features)
        del envelope["features"][name]
        return BadRecord(kind, json.dumps(envelope).encode(), f"features.{name}")
    if kind == "wrong_type":
        name = _numeric_feature(features)
        envelope["features"][name] = "twelve"
        return BadRecord(kind, json.dumps(envelope).encode(), f"features.{name}")
    if kind == "not_json":
        return BadRecord(kind, b'{"request_id": "' + request_id.encode() + b'", "features": {', "payload")
    if kind == "over_64_kib":
        envelope["note"] = "x" * DEFAULT_MAX_RECORD_BYTES
        return BadRecord(kind, json.dumps(envelope).encode(), "payload")
    if kind == "long_request_id":
        envelope["request_id"] = "r" * (MAX_ID_CHARS + 44)
        return BadRecord(kind, json.dumps(envelope).encode(), "request_id")
    raise ValueError(f"unknown kind of invalid record {kind!r}; the kinds are {', '.join(INVALID_KINDS)}")


def kind_of_request(k: int) -> str | None:
    """The kind of invalid record request `k` of a caller carries, or None for a valid one: every fifth is invalid,
    the kinds taking turns."""
    if k % INVALID_EVERY != INVALID_EVERY - 1:
        return None
    return INVALID_KINDS[(k // INVALID_EVERY) % len(INVALID_KINDS)]


def protocol_of(k: int) -> str:
    """"http" (JSON) or "grpc" for request `k` of a caller: valid ones alternate; invalid ones go a round of every
    kind over HTTP, then a round over gRPC."""
    if kind_of_request(k) is None:
        return PROTOCOLS[k % 2]
    return PROTOCOLS[(k // INVALID_EVERY // len(INVALID_KINDS)) % 2]


def overrunning_element(data: bytes, past_end: int = 100) -> bytes:
    """A BYTES element (backends/runtime/bytes_tensor.py) whose length says `past_end` bytes more than the buffer
    holds."""
    return struct.pack("<I", len(data) + past_end) + data


def binary_data_request(raw: bytes, rows: int = 1) -> tuple[bytes, dict[str, str]]:
    """An HTTP infer request for risk_pipeline whose `payload` ([rows, 1] BYTES) is `raw`, byte for byte, in the
    binary-data extension: (body, headers). The JSON header says the tensor's size; the header's own length goes in
    Inference-Header-Content-Length."""
    header = json.dumps({"inputs": [{"name": "payload", "shape": [rows, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


@dataclass(frozen=True)
class Answer:
    """One request of a caller-error flood: `kind` (an invalid kind, MALFORMED_BYTES or VALID), the field its refusal
    must name (None for a valid request), and what came back: a status ("HTTP 400", "INVALID_ARGUMENT", "OK", ...)
    and message, or status None when nothing came back."""
    kind: str
    field: str | None
    status: str | None
    message: str = ""

    @property
    def as_expected(self) -> bool:
        """A valid request scored; an invalid one refused as the caller's error, naming its field."""
        if self.field is None:
            return self.status in ANSWERED_OK
        return self.status in REFUSALS and f"{self.field}:" in self.message

    def label(self) -> str:
        """The outcome as the report counts it."""
        if self.status is None:
            return f"{self.kind}: no answer ({self.message[:80]})"
        if self.as_expected:
            return f"{self.kind}: answered" if self.field is None else f"{self.kind}: {self.status} naming {self.field}"
        return f"{self.kind}: {self.status} {self.message[:100]}"


def count(answers: Iterable[Answer]) -> dict:
    """A flood's result: every outcome counted, the unanswered, per side (invalid, valid) how many were sent and
    how many were answered as they must be, and up to UNEXPECTED_SHOWN distinct outcomes that were not."""
    answers = list(answers)
    invalid = [a for a in answers if a.field is not None]
    valid = [a for a in answers if a.field is None]
    return {"sent": len(answers), "outcomes": dict(Counter(a.label() for a in answers)),
            "unanswered": sum(a.status is None for a in answers),
            "invalid": {"sent": len(invalid), "as_expected": sum(a.as_expected for a in invalid)},
            "valid": {"sent": len(valid), "as_expected": sum(a.as_expected for a in valid)},
            "unexpected": sorted({a.label() for a in answers if not a.as_expected})[:UNEXPECTED_SHOWN]}
