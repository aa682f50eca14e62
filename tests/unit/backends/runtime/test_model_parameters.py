"""The one reader of model config parameters: types from the field, defaults for absent or blank values, the
parameter named in every error, nested settings, and the keys a settings class reads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from s2t.backends.runtime.model_parameters import (MODEL_FOLDER, VERSION_FOLDER, ParameterError, declared_parameters, parameter,
                                                   path_parameter, positive_integer, read_parameters, seconds_from_ms, settings_of,
                                                   unknown_parameters)


@dataclass(frozen=True)
class Inner:
    limit_bytes: int = parameter("limit_bytes", 10, parse=positive_integer)


@dataclass(frozen=True)
class Example:
    name: str = parameter("name")
    count: int = parameter("count", 3)
    rate: float = parameter("rate", 0.5)
    enabled: bool = parameter("enabled", False)
    folder: Path | None = parameter("folder", None)
    timeout_s: float = parameter("timeout_ms", 1.0, parse=seconds_from_ms)
    inner: Inner = settings_of(Inner)
    clock: object = None  # not from the config

    def __post_init__(self):
        if self.count > 100:
            raise ValueError(f"count must be at most 100, got {self.count}")


def params(**values):
    return {key: {"string_value": value} for key, value in values.items()}


@pytest.mark.parametrize("given, expected", [
    (params(name="a"), Example("a", 3, 0.5, False, None, 1.0, inner=Inner(10))),
    (params(name=" a ", count="7", rate="1e-3", enabled="TRUE", folder="x/y", timeout_ms="250", limit_bytes="64"),
     Example("a", 7, 0.001, True, Path("x/y"), 0.25, inner=Inner(64))),
    (params(name="a", count="", rate="  ", enabled="no"), Example("a", 3, 0.5, False, inner=Inner(10))),
    ({"name": {"string_value": "a"}, "count": {}}, Example("a", inner=Inner())),  # no string_value: unset
])
def test_values_are_parsed_by_the_field_type_and_unset_ones_keep_the_default(given, expected):
    assert read_parameters(Example, given) == expected


@pytest.mark.parametrize("given, message", [
    ({}, "parameter name is required"),
    (params(name=""), "parameter name is required"),
    (params(name="a", count="3.5"), "parameter count: expected an integer, got '3.5'"),
    (params(name="a", rate="fast"), "parameter rate: expected a number, got 'fast'"),
    (params(name="a", rate="nan"), "parameter rate: expected a finite number, got 'nan'"),
    (params(name="a", enabled="maybe"), "parameter enabled: expected true or false, got 'maybe'"),
    (params(name="a", timeout_ms="soon"), "parameter timeout_ms: expected a number"),
    (params(name="a", limit_bytes="0"), "parameter limit_bytes: must be a positive integer, got '0'"),
    (params(name="a", count="101"), "count must be at most 100, got 101"),
])
def test_every_failure_names_the_parameter_and_the_reason(given, message):
    with pytest.raises(ParameterError, match=message):
        read_parameters(Example, given)


def test_a_settings_class_chooses_the_error_its_callers_catch():
    class Refused(ValueError):
        pass

    with pytest.raises(Refused, match="parameter name is required"):
        read_parameters(Example, {}, Refused)


def test_fields_given_by_the_caller_are_not_read_from_the_config():
    clock = object()
    assert read_parameters(Example, params(name="a"), clock=clock).clock is clock


def test_the_keys_a_settings_class_reads_include_its_nested_settings():
    assert declared_parameters(Example) == {"name", "count", "rate", "enabled", "folder", "timeout_ms", "limit_bytes"}
    assert unknown_parameters(Example, params(name="a", limt_bytes="5", extra="1")) == ["extra", "limt_bytes"]


@dataclass(frozen=True)
class Files:
    weights: Path | None = path_parameter("weights", None)
    table: Path = path_parameter("table", Path("table.onnx"), within=VERSION_FOLDER)


@dataclass(frozen=True)
class WithFiles:
    files: Files = settings_of(Files)


FOLDERS = {MODEL_FOLDER: Path("/repo/m"), VERSION_FOLDER: Path("/repo/m/2")}


@pytest.mark.parametrize("given, folders, expected", [
    ({}, FOLDERS, Files(None, Path("/repo/m/2/table.onnx"))),
    (params(weights="w.gguf", table="sub/t.onnx"), FOLDERS, Files(Path("/repo/m/w.gguf"), Path("/repo/m/2/sub/t.onnx"))),
    (params(weights="/abs/w.gguf", table="/abs/t.onnx"), FOLDERS, Files(Path("/abs/w.gguf"), Path("/abs/t.onnx"))),
    (params(weights="w.gguf"), None, Files(Path("w.gguf"), Path("table.onnx"))),  # check-config: as written
])
def test_a_file_parameter_is_resolved_in_its_folder_default_included_and_kept_as_written_without_folders(
        given, folders, expected):
    assert read_parameters(Files, given, folders=folders) == expected
    assert read_parameters(WithFiles, given, folders=folders) == WithFiles(files=expected)


def test_a_file_parameter_is_relative_to_the_model_or_the_version_folder_only():
    with pytest.raises(ValueError, match="within must be 'model' or 'version', got 'repository'"):
        path_parameter("weights", within="repository")

