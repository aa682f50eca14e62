"""Legacy records (JSON or protobuf bytes) -> the scorer's two packed inputs, with an error per bad record.

Each record is parsed once; the whole batch is then turned into two arrays in one step, so the work per
record is the parse and one dictionary look-up per attribute. Both forms of the legacy record (the JSON object
and the `SkillRecord` of s2t/wire/skill.proto) may be mixed in one batch: the form is detected per payload,
and both give the same errors, because both become the same feature map before any attribute is checked.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

try:
    from orjson import loads as _fast_json_loads
except ImportError:  # an image without orjson parses every record with the standard library
    _fast_json_loads = None

from s2t.backends.records.example_record import as_example
from s2t.backends.records.feature_spec import (INTEGER, CategoricalFeature, FeatureSpec, count_column, sparse_columns,
                                               value_column)
from s2t.backends.runtime.model_parameters import VERSION_FOLDER, parameter, path_parameter, positive_integer
from s2t.backends.records.record_types import LegacyRecord, NoValues, RecordError  # the decoder's interface too

# Bounds on what a record may carry; each is refused with its own error, naming the field. The byte limit comes
# first and bounds everything else; the others keep what a record leaves behind (routing keys, stream state,
# metrics) small whatever the sender does.
DEFAULT_MAX_RECORD_BYTES = 64 * 1024
MAX_ID_CHARS = 256  # request_id, stream_id
MAX_FEATURES = 256  # entries of the feature map (the model reads 20)
# Python refuses to turn a JSON integer of more digits than this into an int (CVE-2020-10735).
JSON_MAX_INT_DIGITS = 4300
SEQUENCE_ID_MAX = 2 ** 63 - 1  # answers carry it as INT64
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def max_record_bytes_parameter():
    """The `max_record_bytes` field every model that decodes records declares."""
    return parameter("max_record_bytes", DEFAULT_MAX_RECORD_BYTES, parse=positive_integer)


@dataclass(frozen=True)
class AdapterSettings:
    """skill_adapter's parameters: the feature spec beside its model.py, the size limit of one record."""

    feature_spec: Path = path_parameter("feature_spec", within=VERSION_FOLDER)
    max_record_bytes: int = max_record_bytes_parameter()


# A serialized SkillRecord starts with the tag of its lowest-numbered non-default field (every protobuf
# serializer writes fields in field-number order): fields 1-5 give these bytes. A JSON text starts with a value
# or JSON whitespace; the tags 0x0A and 0x20 are also JSON whitespace, so those payloads may be either form.
_PROTOBUF_FIRST_BYTES = frozenset(b"\x0a\x12\x18\x20\x2a")
_JSON_WHITESPACE = b" \t\r\n"
_JSON_VALUE_START = frozenset(b'{["-0123456789tfn')
_JSON_OBJECT_START = ord("{")
# Python 3.11's parser refuses nesting at about 1,000 levels (less the stack in use), orjson past 1,024: a record
# with this many brackets, which could nest between the two, is parsed exactly. No real record comes near it.
_FAST_PARSE_MAX_BRACKETS = 256


@dataclass(frozen=True)
class DecodedBatch:
    categorical: np.ndarray  # int64 [records, n_categorical]; a failed record's row is zeros
    numeric: np.ndarray  # float32 [records, n_numeric]
    errors: tuple[RecordError | None, ...]
    # The envelope's request_id per record, as text (None where absent or where the record failed).
    request_ids: tuple[str | None, ...] = ()


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, NoValues):
        return "no value (an empty tf.Example feature)"
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
        self._padding = sparse_padding(spec)

    def decode(self, payloads: Sequence[bytes]) -> DecodedBatch:
        n_cat, n_num = len(self.spec.categorical), len(self.spec.numeric)
        cat_rows, num_rows, errors, request_ids = [], [], [], []
        for payload in payloads:
            try:
                record = self._parse_fast(payload)
                if record is not None:
                    try:
                        cats, nums = self._row(record.features)
                    except RecordError:
                        record = None
                if record is None:
                    # What the fast parse leaves, and every record that fails, is decided by the exact parse: its
                    # answer and its error are the standard library's.
                    record = self.parse(payload)
                    cats, nums = self._row(record.features)
            except RecordError as err:
                cats, nums = [0] * n_cat, [0.0] * n_num
                errors.append(err)
                request_ids.append(None)
            else:
                errors.append(None)
                request_ids.append(None if record.request_id in (None, "") else str(record.request_id))
            cat_rows.append(cats)
            num_rows.append(nums)
        return DecodedBatch(
            np.array(cat_rows, dtype=np.int64).reshape(len(payloads), n_cat),
            np.array(num_rows, dtype=np.float32).reshape(len(payloads), n_num),
            tuple(errors),
            tuple(request_ids),
        )

    def parse(self, payload: bytes) -> LegacyRecord:
        return parse_record(payload, self.max_record_bytes)

    def _parse_fast(self, payload: bytes) -> LegacyRecord | None:
        """A JSON object record as orjson parses it (about a quarter of the standard library's time), or None where
        it does not parse so. Where orjson and the standard library differ, orjson refuses (NaN, numbers past a
        double, lone surrogates, nesting past 1,024 levels, encodings other than UTF-8) or gives a float for an
        integer past 64 bits, which no identifier and no integer feature accepts; nesting that one takes and the
        other refuses is left to the exact parse by its bracket count: either way the record is then parsed again
        exactly."""
        if (_fast_json_loads is None or type(payload) is not bytes or not payload or payload[0] != _JSON_OBJECT_START
                or len(payload) > self.max_record_bytes
                or payload.count(b"[") + payload.count(b"{") > _FAST_PARSE_MAX_BRACKETS):
            return None
        try:
            record = _fast_json_loads(payload)
        except ValueError:  # orjson.JSONDecodeError
            return None
        if type(record) is not dict:
            return None
        try:
            return _envelope(record)
        except RecordError:
            return None

    def _row(self, features: Mapping[str, object]) -> tuple[list[int], list[float]]:
        if self.spec.sparse:
            features = spread_sparse(features, self.spec.sparse, self._padding)
        if self.spec.values:
            features = _spread(features, self.spec.values)
        if self.spec.defaults:
            features = {**self.spec.defaults, **features}
        cats = []
        for feature in self.spec.categorical:
            value = features.get(feature.name)
            if feature.kind == INTEGER:
                cats.append(_integer(feature.name, value))
                continue
            if not isinstance(value, str):
                raise RecordError(f"features.{feature.name}",
                                  "missing" if value is None else f"expected a string, got {_type_name(value)}")
            # An unknown category takes the out-of-vocabulary index, exactly as the legacy lookup does; a hashed
            # feature takes its bucket, as TensorFlow's hash computes it.
            try:
                cats.append(feature.index_of(value))
            except UnicodeEncodeError:
                # A JSON string may hold a lone surrogate (\ud800), which has no UTF-8 bytes to hash.
                raise RecordError(f"features.{feature.name}", "not valid Unicode text (a lone surrogate)") from None
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
                raise RecordError(f"features.{name}", f"not a finite float32 number ({_shown(value)})")
            nums.append(number)
        return cats, nums


def _spread(features: Mapping[str, object], values: Mapping[str, int]) -> dict[str, object]:
    """Each feature of several values as its columns; a feature sent with another number of values is refused."""
    spread = dict(features)
    for key, count in values.items():
        value = spread.pop(key, None)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) != count:
            got = f"{len(value)}" if isinstance(value, list) else f"a {_type_name(value)}"
            raise RecordError(f"features.{key}", f"expected a list of {count} values, got {got}")
        spread.update({value_column(key, i): v for i, v in enumerate(value)})
    return spread


def sparse_padding(spec: FeatureSpec) -> dict[str, object]:
    """What fills each value column of a sparse feature past the record's values: a value of the column's type, which
    the graph never reads (the count column says where the record's values end)."""
    integers = {f.name for f in spec.categorical if f.kind == INTEGER}
    numbers = set(spec.numeric)
    return {column: 0.0 if column in numbers else 0 if column in integers else ""
            for key, most in spec.sparse.items() for column in sparse_columns(key, most)}


def spread_sparse(features: Mapping[str, object], sparse: Mapping[str, int], padding: Mapping[str, object]
                  ) -> dict[str, object]:
    """Each sparse feature as its padded value columns and its count column. A record may leave it out or send no
    value (no value, as TensorFlow parses it), one value or a list; more than the feature's limit is refused."""
    spread = dict(features)
    for key, most in sparse.items():
        value = spread.pop(key, None)
        values = [] if value is None else value if isinstance(value, list) else [value]
        if len(values) > most:
            raise RecordError(f"features.{key}", f"{len(values)} values is over the limit of {most} for this sparse "
                                                 "feature (the most values per record it was converted with)")
        columns = sparse_columns(key, most)
        spread.update(zip(columns, [*values, *(padding[c] for c in columns[len(values):])]))
        spread[count_column(key)] = len(values)
    return spread


def _integer(name: str, value: object) -> int:
    """An int64 feature's value: the graph computes with the integer itself, as the SavedModel does."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"features.{name}",
                          "missing" if value is None else f"expected an integer, got {_type_name(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise RecordError(f"features.{name}", f"{_shown(value)} is outside the int64 range")
    return value


def _column_value(feature: CategoricalFeature, value: object) -> int:
    # A vocabulary or hashed feature maps its text (the hash bucket of a hashed one, as TensorFlow computes it).
    return int(value) if feature.kind == INTEGER else feature.index_of(str(value))


def parse_record(payload: bytes, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> LegacyRecord:
    """The record in either form; raises the RecordError of the first form tried when no form fits."""
    if not isinstance(payload, (bytes, bytearray)):
        raise RecordError("payload", f"expected bytes, got {type(payload).__name__}")
    if not payload:
        raise RecordError("payload", "empty")
    if len(payload) > max_record_bytes:
        raise RecordError("payload", f"{len(payload)} bytes is over the limit of {max_record_bytes}")
    first_error = None
    for parse in _forms(payload):
        try:
            return parse(payload)
        except RecordError as err:
            first_error = first_error or err
    raise first_error


def stream_position(record: LegacyRecord, stream: str) -> int:
    """The record's sequence_id on `stream` (the correlation id), within 0..2^63-1; a stream_id, when sent, must
    name that stream. A protobuf record cannot tell 0 from absent (proto3): it reads 0, as legacy callers meant."""
    if record.stream_id not in (None, "") and str(record.stream_id) != stream:
        raise RecordError("stream_id", f"{_shown(record.stream_id)} is not the stream of this sequence "
                                       f"({_shown(stream)})")
    sequence_id = record.sequence_id
    if sequence_id is None:
        raise RecordError("sequence_id", "missing")
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int):
        raise RecordError("sequence_id", f"expected an integer, got {_type_name(sequence_id)}")
    if not 0 <= sequence_id <= SEQUENCE_ID_MAX:
        raise RecordError("sequence_id", f"{_shown(sequence_id)} is outside 0..{SEQUENCE_ID_MAX}")
    return sequence_id


def _shown(value: object, limit: int = 40) -> str:
    """`value` for a message, cut short: an error does not echo a hostile record back in full."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _forms(payload: bytes) -> tuple[Callable[[bytes], LegacyRecord], ...]:
    """The parsers to try, most likely form first; the error of the first one is the one reported."""
    if payload[0] not in _PROTOBUF_FIRST_BYTES:
        return (_parse_json,)
    if payload[0] not in _JSON_WHITESPACE:
        return (_parse_protobuf,)
    text = payload.lstrip(_JSON_WHITESPACE)
    if text and text[0] in _JSON_VALUE_START:
        return _parse_json, _parse_protobuf
    return _parse_protobuf, _parse_json


def _parse_json(payload: bytes) -> LegacyRecord:
    try:
        record = json.loads(payload)
    except UnicodeDecodeError:
        raise RecordError("payload", "not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise RecordError("payload", f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:
        raise RecordError("payload", "JSON nested too deeply") from None
    except ValueError:
        # The one other refusal of json.loads: an integer literal longer than Python converts.
        raise RecordError("payload", f"a JSON integer has more than {JSON_MAX_INT_DIGITS} digits") from None
    if not isinstance(record, dict):
        raise RecordError("payload", f"a record must be a JSON object, got {_type_name(record)}")
    return _envelope(record)


def _envelope(record: dict) -> LegacyRecord:
    """A parsed JSON object as the record, its envelope checked."""
    return _checked(LegacyRecord(record.get("request_id"), record.get("stream_id"), record.get("sequence_id"),
                                 record.get("features")))


def _checked(record: LegacyRecord) -> LegacyRecord:
    """The envelope within its bounds, whatever the form."""
    features = record.features
    if features is None:
        raise RecordError("features", "missing")
    if not isinstance(features, dict):
        raise RecordError("features", f"must be an object, got {_type_name(features)}")
    if len(features) > MAX_FEATURES:
        raise RecordError("features", f"{len(features)} entries is over the limit of {MAX_FEATURES}")
    for name in ("request_id", "stream_id"):
        value = getattr(record, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RecordError(name, f"expected a string, got {_type_name(value)}")
        if len(str(value)) > MAX_ID_CHARS:
            raise RecordError(name, f"{len(str(value))} characters is over the limit of {MAX_ID_CHARS}")
    return record


@lru_cache(maxsize=1)
def _protobuf_record():
    # Imported on first use: the code is generated by `make proto`, and a JSON-only deployment (the NGC image
    # without the protobuf package, say) keeps serving JSON records without it.
    from google.protobuf.message import DecodeError

    from s2t.wire.skill_pb2 import SkillRecord
    return SkillRecord, DecodeError


def _parse_protobuf(payload: bytes) -> LegacyRecord:
    try:
        record_class, decode_error = _protobuf_record()
    except ImportError as err:
        raise RecordError("payload", f"protobuf records are not available here ({err}; run `make proto`)") from None
    record = record_class()
    try:
        record.ParseFromString(bytes(payload))
    except (decode_error, RuntimeError, ValueError):
        record = None
    # A SkillRecord without features could never be scored: such bytes may be a tf.Example (see example_record).
    if record is None or (not record.features
                          and [field.name for field, _ in record.ListFields()] in ([], ["request_id"])):
        example = as_example(payload)
        if example is not None:
            return _checked(example)
    if record is None:
        raise RecordError("payload", "not a valid SkillRecord protobuf")
    # proto3 cannot tell an empty map from an absent one: both read as `{}`, so the first attribute is reported
    # missing, exactly as for the JSON record {"features": {}}.
    # The map read key by key and each value by the name its oneof gives (none set reads None, as a JSON null):
    # the map's items() view iterates in Python, and this loop is most of the cost of a protobuf record.
    entries = record.features
    names = list(entries)
    values = [getattr(value, value.WhichOneof("kind") or "", None) for value in map(entries.__getitem__, names)]
    return _checked(LegacyRecord(record.request_id, record.stream_id, record.sequence_id, dict(zip(names, values))))


def encode_columns(spec: FeatureSpec, columns: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Columns named as the SavedModel inputs (as in germancredit.csv) -> the scorer's packed inputs."""
    missing = [n for n in spec.names if n not in columns]
    if missing:
        raise KeyError(f"columns missing: {', '.join(missing)}")
    rows = len(columns[spec.names[0]]) if spec.names else 0
    categorical = np.array([np.fromiter((_column_value(f, v) for v in columns[f.name]), dtype=np.int64,
                                        count=rows) for f in spec.categorical], dtype=np.int64).reshape(-1, rows).T
    numeric = np.array([np.asarray(columns[n], dtype=np.float32) for n in spec.numeric],
                       dtype=np.float32).reshape(-1, rows).T
    return np.ascontiguousarray(categorical), np.ascontiguousarray(numeric)


