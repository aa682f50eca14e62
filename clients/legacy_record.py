"""The legacy record in its two forms: the JSON object and the `SkillRecord` of s2t/wire/skill.proto."""
from __future__ import annotations

import json
from typing import Mapping

from s2t.wire import skill_pb2


def feature_value(value: object) -> skill_pb2.FeatureValue:
    """A JSON-typed value as the typed oneof; None stays unset (read back as a missing attribute)."""
    if value is None:
        return skill_pb2.FeatureValue()
    if isinstance(value, bool):
        return skill_pb2.FeatureValue(bool_value=value)
    if isinstance(value, int):
        return skill_pb2.FeatureValue(int_value=value)
    if isinstance(value, float):
        return skill_pb2.FeatureValue(number_value=value)
    if isinstance(value, str):
        return skill_pb2.FeatureValue(string_value=value)
    raise TypeError(f"a SkillRecord feature is a string, number or boolean, got {type(value).__name__}")


def to_protobuf(record: Mapping[str, object]) -> skill_pb2.SkillRecord:
    """The JSON form {"request_id", "stream_id", "sequence_id", "event_time_ms", "features"} as a SkillRecord."""
    return skill_pb2.SkillRecord(
        request_id=str(record.get("request_id") or ""),
        stream_id=str(record.get("stream_id") or ""),
        sequence_id=int(record.get("sequence_id") or 0),
        event_time_ms=int(record.get("event_time_ms") or 0),
        features={name: feature_value(value) for name, value in record.get("features", {}).items()},
    )


def encode(record: Mapping[str, object], form: str) -> bytes:
    """The payload bytes Triton's `payload` input takes, in either form."""
    if form == "json":
        return json.dumps(record).encode()
    if form == "protobuf":
        return to_protobuf(record).SerializeToString()
    raise ValueError(f"form must be json or protobuf, got {form!r}")
