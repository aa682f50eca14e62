"""The `parameters` of a Triton model config, read into typed settings: the one reader every model uses.

Triton hands a python model its config as JSON, where each parameter is `{"string_value": "..."}`. A settings class is
a frozen dataclass whose fields say which parameter fills them (`parameter("key")`) or which settings class reads
the same parameters (`settings_of(Cls)`); the field's type says how the text is parsed, and the key carries its unit
(`_ms`, `_s`, `_bytes`). A parameter that is absent or blank keeps the field's default; a field without one is
required. A file the config names (`path_parameter`) is relative to the model's folder or to the served version's
folder; the reader resolves it when it is told those folders (`Glue.settings` does, for every model), so no
settings type needs a reader of its own. `s2t check-config` reads every config with the same classes, so a typo or a
bad value is found before a server refuses the model.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

T = TypeVar("T")

_KEY = "parameter"
_PARSE = "parse"
_NESTED = "settings"
_WITHIN = "within"
# The folders a file parameter may be relative to: the model's folder and the served version's folder in it.
MODEL_FOLDER, VERSION_FOLDER = "model", "version"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ParameterError(ValueError):
    """A config parameter that is missing, unknown or does not parse; the message names the parameter."""


def parameter(key: str, default: Any = dataclasses.MISSING, parse: Callable[[str], Any] | None = None):
    """A dataclass field filled from the config parameter `key`; `parse` replaces the type's own parsing."""
    metadata = {_KEY: key, _PARSE: parse}
    return dataclasses.field(default=default, metadata=metadata)


def path_parameter(key: str, default: Any = dataclasses.MISSING, within: str = MODEL_FOLDER):
    """A dataclass field holding a file the config names relative to `within` (MODEL_FOLDER or VERSION_FOLDER);
    an absolute path is kept as given, and so is every path when the reader is given no folders (s2t check-config
    reads a config without serving a version)."""
    if within not in (MODEL_FOLDER, VERSION_FOLDER):
        raise ValueError(f"within must be {MODEL_FOLDER!r} or {VERSION_FOLDER!r}, got {within!r}")
    return dataclasses.field(default=default, metadata={_KEY: key, _PARSE: Path, _WITHIN: within})


def settings_of(cls: type) -> Any:
    """A dataclass field holding `cls`, read from the same parameters (keyword-only, so it may follow defaults)."""
    return dataclasses.field(metadata={_NESTED: cls}, kw_only=True)


def read_parameters(cls: type[T], parameters: Mapping, error: type[ValueError] = ParameterError,
                    folders: Mapping[str, Path] | None = None, **given) -> T:
    """`cls` built from `parameters`; `given` fills fields that do not come from the config (a clock).
    `folders` (MODEL_FOLDER and VERSION_FOLDER -> the model's folders) resolves the files its path parameters name,
    defaults included. Every failure, the class's own checks included, is raised as `error`."""
    hints = typing.get_type_hints(cls)
    values = dict(given)
    for field in dataclasses.fields(cls):
        if field.name in given:
            continue
        if _NESTED in field.metadata:
            values[field.name] = read_parameters(field.metadata[_NESTED], parameters, error, folders)
            continue
        if _KEY not in field.metadata:
            continue
        key = field.metadata[_KEY]
        raw = parameters.get(key, {}).get("string_value")
        if raw is None or not raw.strip():
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise error(f"parameter {key} is required")
            continue
        try:
            values[field.name] = (field.metadata[_PARSE] or _parser(hints[field.name]))(raw.strip())
        except ValueError as err:
            raise error(f"parameter {key}: {err}") from None
    if folders is not None:
        _resolve_files(cls, values, folders, given)
    try:
        return cls(**values)
    except ValueError as err:
        raise error(str(err)) from None


def _resolve_files(cls: type, values: dict, folders: Mapping[str, Path], given: Mapping) -> None:
    for field in dataclasses.fields(cls):
        if _WITHIN not in field.metadata or field.name in given:
            continue
        value = values.get(field.name, field.default)
        if value is not None and value is not dataclasses.MISSING:
            values[field.name] = Path(folders[field.metadata[_WITHIN]]) / value  # an absolute value replaces the folder


def declared_parameters(cls: type) -> set[str]:
    """Every parameter key `cls` reads, its nested settings' included."""
    keys = set()
    for field in dataclasses.fields(cls):
        if _NESTED in field.metadata:
            keys |= declared_parameters(field.metadata[_NESTED])
        elif _KEY in field.metadata:
            keys.add(field.metadata[_KEY])
    return keys


def unknown_parameters(cls: type, parameters: Mapping) -> list[str]:
    """Keys set in a config that `cls` does not read: a typo there would silently keep a default."""
    return sorted(set(parameters) - declared_parameters(cls))


def _parser(kind) -> Callable[[str], Any]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        members = [k for k in typing.get_args(kind) if k is not type(None)]
        if len(members) == 1:
            return _parser(members[0])
    parsers = {int: _integer, float: _number, bool: _boolean, str: str, Path: Path}
    if kind not in parsers:
        raise TypeError(f"no parser for {kind!r}: declare the field with parameter(..., parse=...)")
    return parsers[kind]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def seconds_from_ms(text: str) -> float:
    """For a field kept in seconds whose parameter is given in milliseconds."""
    return _number(text) / 1000


def positive_integer(text: str) -> int:
    value = _integer(text)
    if value <= 0:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value
