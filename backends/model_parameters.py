"""The `parameters` of a Triton model config, as the python backend hands them over (JSON of the config)."""
from __future__ import annotations

from typing import Mapping


def string_parameter(parameters: Mapping, key: str, default: str | int | float = "") -> str:
    """The string_value of `parameters[key]`, or `default` (as a string) when the config does not set it."""
    return str(parameters.get(key, {}).get("string_value", default))
