"""What a published version folder of `llm` adds to the model's config: its own GGUF file and its own defaults.

`s2t publish llm FILE.gguf [--settings FILE.json]` builds `<N>/model.gguf` (and `<N>/settings.json`) beside
`<N>/model.py`. The version's file is what it serves, whatever `model_path` says in the shared config (a version
that served another model than the one validated and recorded for it would make the history lie). Its settings
override the config's parameters for that version only, so two versions of the same weights can differ in their
defaults. Version 1 as shipped has neither and serves the config as it is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

MODEL_FILE = "model.gguf"
SETTINGS_FILE = "settings.json"
# Generation defaults and limits a version may set for itself. Engine sizing (threads, slots, queue) stays in the
# shared config: it is about the host, not the version.
VERSION_KEYS = ("default_max_tokens", "max_tokens_limit", "max_prompt_tokens", "stream_by_default", "chat_template",
                "context_per_slot")


class VersionSettingsError(ValueError):
    """A version's settings that cannot be used; the message names the key."""


def parse_settings(text: str) -> dict[str, str]:
    """A settings file's text as config parameter values (text), or VersionSettingsError naming what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise VersionSettingsError(f"{SETTINGS_FILE}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise VersionSettingsError(f"{SETTINGS_FILE}: expected an object of settings, got {type(data).__name__}")
    settings = {}
    for key, value in data.items():
        if key not in VERSION_KEYS:
            raise VersionSettingsError(f"{SETTINGS_FILE}.{key}: unknown (a version may set {', '.join(VERSION_KEYS)})")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, (int, str)):
            raise VersionSettingsError(f"{SETTINGS_FILE}.{key}: expected a number, text or true/false, "
                                       f"got {type(value).__name__}")
        settings[key] = str(value)
    return settings


def version_parameters(parameters: Mapping[str, Mapping[str, str]], version_dir: Path) -> dict:
    """The config's parameters as this version serves them: its GGUF file and its settings file, when it has them."""
    merged = {key: dict(value) for key, value in parameters.items()}
    version_dir = Path(version_dir)
    settings = version_dir / SETTINGS_FILE
    if settings.is_file():
        for key, value in parse_settings(settings.read_text()).items():
            merged[key] = {"string_value": value}
    model = version_dir / MODEL_FILE
    if model.is_file():
        merged["model_path"] = {"string_value": str(model.resolve())}
    return merged
