"""A generation request as the `llm` model takes it (Triton's LLM conventions), checked field by field.

Inputs follow Triton's generate extension and its LLM backends: `text_input`, `max_tokens`, the sampling
parameters `temperature`, `top_p`, `top_k`, `seed`, and `stream`. Every check names the field and the reason; the
prompt's length in tokens is checked by the engine, which alone can count them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from backends.model_parameters import parameter, positive_integer


class GenerationError(ValueError):
    """This request's own fault; answered INVALID_ARG, the other requests are unaffected."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


@dataclass(frozen=True)
class GenerationLimits:
    max_tokens_limit: int = parameter("max_tokens_limit", 512, parse=positive_integer)
    default_max_tokens: int = parameter("default_max_tokens", 64, parse=positive_integer)
    max_prompt_tokens: int = parameter("max_prompt_tokens", 1024, parse=positive_integer)
    # A cheap bound before tokenization: no tokenizer makes fewer than one token per 16 bytes of text.
    max_prompt_bytes: int = 16 * 1024
    stream_by_default: bool = parameter("stream_by_default", True)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = -1
    stream: bool = True

    def sampling(self) -> dict:
        """llama.cpp server's sampling fields (temperature 0 = greedy, deterministic)."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed}


def _scalar(inputs: Mapping[str, np.ndarray], name: str):
    array = inputs.get(name)
    if array is None:
        return None
    flat = np.asarray(array).ravel()
    if flat.size != 1:
        raise GenerationError(name, f"expected one value, got {flat.size}")
    return flat[0]


def _number(inputs, name: str, default, kind, low, high):
    value = _scalar(inputs, name)
    if value is None:
        return default
    if isinstance(value, (bytes, str, np.bytes_, np.str_)) or isinstance(value, (bool, np.bool_)):
        raise GenerationError(name, f"expected a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise GenerationError(name, f"must be between {low} and {high}, got {value}")
    if kind is int and number != int(number):
        raise GenerationError(name, f"expected an integer, got {value}")
    return kind(number)


def parse_generation(inputs: Mapping[str, np.ndarray], limits: GenerationLimits) -> GenerationRequest:
    """The request, or GenerationError naming the first bad field."""
    raw = _scalar(inputs, "text_input")
    if raw is None:
        raise GenerationError("text_input", "missing")
    if isinstance(raw, (bytes, np.bytes_)):
        if len(raw) > limits.max_prompt_bytes:
            raise GenerationError("text_input", f"{len(raw)} bytes, over the limit of {limits.max_prompt_bytes}")
        try:
            prompt = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as err:
            raise GenerationError("text_input", f"not UTF-8 ({err.reason} at byte {err.start})") from None
    elif isinstance(raw, (str, np.str_)):
        prompt = str(raw)
        if len(prompt.encode("utf-8")) > limits.max_prompt_bytes:
            raise GenerationError("text_input", f"over the limit of {limits.max_prompt_bytes} bytes")
    else:
        raise GenerationError("text_input", f"expected text, got {type(raw).__name__}")
    if not prompt.strip():
        raise GenerationError("text_input", "empty prompt")
    stream = _scalar(inputs, "stream")
    return GenerationRequest(
        prompt=prompt,
        max_tokens=_number(inputs, "max_tokens", limits.default_max_tokens, int, 1, limits.max_tokens_limit),
        temperature=_number(inputs, "temperature", 0.0, float, 0.0, 2.0),
        top_p=_number(inputs, "top_p", 1.0, float, 0.0, 1.0),
        top_k=_number(inputs, "top_k", 0, int, 0, 1000),
        seed=_number(inputs, "seed", -1, int, -1, 2**31 - 1),
        stream=limits.stream_by_default if stream is None else bool(stream),
    )


def check_prompt_tokens(prompt_tokens: int, limits: GenerationLimits) -> None:
    if prompt_tokens > limits.max_prompt_tokens:
        raise GenerationError("text_input", f"{prompt_tokens} tokens, over the limit of {limits.max_prompt_tokens}")
