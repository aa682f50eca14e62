"""Edit a live model's config.pbtxt in place: change only the values, keep the comments, replace it atomically.

The edited text is parsed with Triton's schema before it replaces the file, and it replaces the file with one
rename (then fsync of the file and its folder): Triton's poller, or a `load` in explicit mode, reads either the
old config or the new one, never a half-written one.
"""
from __future__ import annotations

import re
from pathlib import Path

from s2t.atomic_files import write_atomically
from s2t.control import config_cache
from s2t.control.version_store import VersionStore
from s2t.errors import S2TError


class ConfigEditError(S2TError):
    pass


def set_string_parameter(text: str, key: str, value: str, where: str = "config.pbtxt") -> str:
    # Whitespace or comment lines may stand between the tokens (a parameter's block often starts with its reason).
    gap = r'(?:\s|#[^\n]*)*'
    pattern = re.compile(r'(parameters:' + gap + r'\{' + gap + r'key:\s*"' + re.escape(key) + r'"' + gap + r'value:'
                         + gap + r'\{' + gap + r'string_value:\s*")([^"]*)(")')
    new, count = pattern.subn(lambda m: m.group(1) + value + m.group(3), text)
    if count != 1:
        raise ConfigEditError(f"{where} has {count} lines for parameter {key!r}; expected one")
    return new


def set_step_version(text: str, model: str, version: int, where: str = "config.pbtxt") -> str:
    """The `model_version` of the ensemble step that calls `model` (-1: the newest version Triton loaded)."""
    pattern = re.compile(r'(model_name:\s*"' + re.escape(model) + r'"\s*model_version:\s*)(-?\d+)')
    new, count = pattern.subn(lambda m: m.group(1) + str(version), text)
    if count != 1:
        raise ConfigEditError(f"{where} has {count} steps calling {model!r} with a model_version; expected one")
    return new


def set_pinned_versions(text: str, versions: list[int], where: str = "config.pbtxt") -> str:
    """The versions a `version_policy: { specific: { versions: [ ... ] } }` loads."""
    pattern = re.compile(r'(version_policy:\s*\{\s*specific:\s*\{\s*versions:\s*)(\[[\d\s,]*\]|\d+)(\s*\}\s*\})')
    listed = "[ " + ", ".join(str(v) for v in versions) + " ]"
    new, count = pattern.subn(lambda m: m.group(1) + listed + m.group(3), text)
    if count != 1:
        raise ConfigEditError(f"{where} has {count} `version_policy: {{ specific: {{ versions: [ ... ] }} }}` lines; "
                              "expected one")
    return new


def replace_config(store: VersionStore, path: Path, text: str) -> None:
    """Validate `text` with Triton's schema, then put it in place of `path` in one rename."""
    try:
        config_cache.parsed(text, str(path))
    except ValueError as err:
        raise ConfigEditError(str(err)) from None
    write_atomically(path, text, staging_dir=store.staging)
