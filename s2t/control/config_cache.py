"""Model configs as the rollout steps read them: the file every time, Triton's text parser once per text.

A step asks for the same few configs dozens of times (the model's version policy, every consumer's primary, the
router's split), before and after its own writes. Reading the file each time keeps every answer current; parsing
it again only when its text changed takes the parser, most of a step's own CPU before its change is in force, off
that path. The configs returned are shared: read them, never change them (a step edits the text, config_edit.py).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from s2t import triton_config

# A repository's configs and a step's rewrites of them, with room to spare; bounded for the callers that live long
# and roll out many times (the benchmark's hot swap, a test session).
CONFIGS_KEPT = 64


def load(model_dir: Path):
    """The config in `model_dir`, as its file reads now (triton_config.load's answer and errors)."""
    path = Path(model_dir) / "config.pbtxt"
    return parsed(path.read_text(), str(path))


@lru_cache(maxsize=CONFIGS_KEPT)
def parsed(text: str, where: str):
    """`text` parsed (triton_config.load_text's answer and errors); a config validated before it is written is
    then read back without a second parse."""
    return triton_config.load_text(text, where)
