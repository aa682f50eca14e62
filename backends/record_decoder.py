"""Legacy records (JSON bytes) -> the scorer's two packed inputs, with an error per bad record.

Each record is parsed once; the whole batch is then turned into two arrays in one step, so the work per
record is the JSON parse and one dictionary look-up per attribute.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from backends.feature_spec import FeatureSpec

DEFAULT_MAX_RECORD_BYTES = 64 * 1024
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class RecordError(ValueError):
    """One record cannot be scored; `field` names the attribute (or `payload`), `reason` says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class DecodedBatch:
    categorical: np.ndarray  # int64 [records, n_categorical]; a failed record's row is zeros
    numeric: np.ndarray  # float32 [records, n_numeric]
    errors: tuple[RecordError | None, ...]


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object"


class RecordDecoder:
    def __init__(self, spec: FeatureSpec, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES):
        if max_record_bytes <= 0:
            raise ValueError(f"max_record_bytes must be positive, got {max_record_bytes}")
        self.spec = spec
        self.max_record_bytes = max_record_bytes

    def decode(self, payloads: Sequence[bytes]) -> DecodedBatch:
        n_cat, n_num = len(self.spec.categorical), len(self.spec.numeric)
        cat_rows, num_rows, errors = [], [], []
        for payload in payloads:
            try:
                cats, nums = self._row(self.features(payload))
            except RecordError as err:
                cats, nums = [0] * n_cat, [0.0] * n_num
                errors.append(err)
            else:
                errors.append(None)
            cat_rows.append(cats)
            num_rows.append(nums)
        return DecodedBatch(
            np.array(cat_rows, dtype=np.int64).reshape(len(payloads), n_cat),
            np.array(num_rows, dtype=np.float32).reshape(len(payloads), n_num),
            tuple(errors),
        )

    def features(self, payload: bytes) -> Mapping[str, object]:
        if not isinstance(payload, (bytes, bytearray)):
            raise RecordError("payload", f"expected bytes, got {type(payload).__name__}")
        if not payload:
            raise RecordError("payload", "empty")
        if len(payload) > self.max_record_bytes:
            raise RecordError("payload", f"{len(payload)} bytes is over the limit of {self.max_record_bytes}")
        try:
            record = json.loads(payload)
        except UnicodeDecodeError:
            raise RecordError("payload", "not UTF-8 text") from None
        except json.JSONDecodeError as err:
            raise RecordError("payload", f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
        except RecursionError:
            raise RecordError("payload", "JSON nested too deeply") from None
        if not isinstance(record, dict):
            raise RecordError("payload", f"a record must be a JSON object, got {_type_name(record)}")
        features = record.get("features")
        if features is None:
            raise RecordError("features", "missing")
        if not isinstance(features, dict):
            raise RecordError("features", f"must be an object, got {_type_name(features)}")
        return features

    def _row(self, features: Mapping[str, object]) -> tuple[list[int], list[float]]:
        cats = []
        for feature in self.spec.categorical:
            value = features.get(feature.name)
            if not isinstance(value, str):
                raise RecordError(f"features.{feature.name}",
                                  "missing" if value is None else f"expected a string, got {_type_name(value)}")
            # An unknown category takes the out-of-vocabulary index, exactly as the legacy lookup does.
            cats.append(feature.index_of(value))
        nums = []
        for name in self.spec.numeric:
            value = features.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RecordError(f"features.{name}",
                                  "missing" if value is None else f"expected a number, got {_type_name(value)}")
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number) or abs(number) > _FLOAT32_MAX:
                raise RecordError(f"features.{name}", f"not a finite float32 number ({value!r})")
            nums.append(number)
        return cats, nums


def encode_columns(spec: FeatureSpec, columns: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Columns named as the SavedModel inputs (as in germancredit.csv) -> the scorer's packed inputs."""
    missing = [n for n in spec.names if n not in columns]
    if missing:
        raise KeyError(f"columns missing: {', '.join(missing)}")
    categorical = np.stack([np.fromiter((f.index_of(str(v)) for v in columns[f.name]), dtype=np.int64,
                                        count=len(columns[f.name])) for f in spec.categorical], axis=1)
    numeric = np.stack([np.asarray(columns[n], dtype=np.float32) for n in spec.numeric], axis=1)
    return categorical, numeric


def request_error(errors: Sequence[RecordError | None]) -> str | None:
    """The message for a request whose records include bad ones; None when every record decoded."""
    bad = [(i, e) for i, e in enumerate(errors) if e is not None]
    if not bad:
        return None
    if len(errors) == 1:
        return str(bad[0][1])
    return "; ".join(f"record {i}: {e}" for i, e in bad)
