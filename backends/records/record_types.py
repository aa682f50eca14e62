"""A legacy record once parsed, whatever its wire form, and the error of a record that cannot be scored: the types
the JSON / SkillRecord decoder (record_decoder) and the tf.Example reader (example_record) share."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from s2t.backends.runtime.serving_errors import InvalidInput


class RecordError(InvalidInput):
    """One record cannot be scored; `field` names the attribute (or `payload`), `reason` says why."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class LegacyRecord:
    """One parsed record, whatever its form; the envelope fields are as sent (None where absent)."""

    request_id: object
    stream_id: object
    sequence_id: object
    features: Mapping[str, object]


class NoValues(list):
    """A tf.Example feature that holds no value: a sparse feature's empty list, an error for any other feature
    (JSON has no such form: a JSON `[]` is an array)."""
