"""A generation request as the `llm` model takes it (Triton's LLM conventions), checked field by field.

Inputs follow Triton's generate extension and its LLM backends: `text_input`, `max_tokens`, the sampling
parameters `temperature`, `top_p`, `top_k`, `seed`, and `stream`. Every check names the field and the reason; the
prompt's length in tokens is checked by the engine, which alone can count them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from s2t.backends.runtime.serving_errors import InvalidInput
from s2t.backends.runtime.model_parameters import parameter, positive_integer


class GenerationError(InvalidInput, ValueError):
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
    stop: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    ignore_eos: bool = False
    # TensorRT-LLM's exclude_input_in_output=false: the single (non-streamed) answer starts with the prompt.
    include_input: bool = False

    def sampling(self) -> dict:
        """llama.cpp server's sampling fields (temperature 0 = greedy, deterministic)."""
        fields = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                  "top_k": self.top_k, "seed": self.seed}
        if self.stop:
            fields["stop"] = list(self.stop)
        if self.bad_words:
            # llama.cpp bans every token of a text given with false; a word mid-sentence is tokenized with its
            # leading space, so both spellings are banned.
            fields["logit_bias"] = [[form, False] for word in self.bad_words
                                    for form in dict.fromkeys((word, " " + word.lstrip()))]
        if self.ignore_eos:
            fields["ignore_eos"] = True
        return fields


# The same setting under the names of Triton's other LLM backends (TensorRT-LLM's inputs).
ALIASES = {"runtime_top_k": "top_k", "runtime_top_p": "top_p", "random_seed": "seed"}
# vLLM's backend takes its sampling settings as one JSON object, `sampling_parameters`; these keys are understood.
SAMPLING_KEYS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")
# As vLLM's backend does, numbers and flags may come as strings there (genai-perf sends {"max_tokens": "16"}).
_NUMERIC_KEYS = {"max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed"}
# Asked for but not computed by this engine: refused when true rather than silently left out.
UNSUPPORTED_WHEN_TRUE = ("return_log_probs", "return_context_logits", "return_generation_logits")
# Always answered (input_tokens, output_tokens, finish_reason on the final response): accepted either way.
ALWAYS_RETURNED = ("return_num_input_tokens", "return_num_output_tokens", "return_finish_reason")
MAX_WORDS, MAX_WORD_BYTES = 8, 128
MAX_SAMPLING_PARAMETERS_BYTES = 4096
INPUTS = ("text_input", "max_tokens", "temperature", "top_p", "top_k", "seed", "stream", "exclude_input_in_output",
          "sampling_parameters", "stop_words", "bad_words", "beam_width", "min_length", *ALIASES, *UNSUPPORTED_WHEN_TRUE,
          *ALWAYS_RETURNED)


def _scalar(inputs: Mapping[str, np.ndarray], name: str):
    array = inputs.get(name)
    if array is None:
        return None
    flat = np.asarray(array).ravel()
    if flat.size != 1:
        raise GenerationError(name, f"expected one value, got {flat.size}")
    return flat[0]


def _number(field: str, value, default, kind, low, high):
    if value is None:
        return default
    if isinstance(value, (bytes, str, np.bytes_, np.str_, bool, np.bool_)):
        raise GenerationError(field, f"expected a number, got {type(value).__name__}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise GenerationError(field, f"expected a number, got {type(value).__name__}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise GenerationError(field, f"must be between {low} and {high}, got {value}")
    if kind is int and number != int(number):
        raise GenerationError(field, f"expected an integer, got {value}")
    return kind(number)


def _flag(field: str, value, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_)):
        raise GenerationError(field, f"expected true or false, got {type(value).__name__}")
    return bool(value)


def _text(field: str, raw) -> str:
    if isinstance(raw, (bytes, np.bytes_)):
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as err:
            raise GenerationError(field, f"not UTF-8 ({err.reason} at byte {err.start})") from None
    if isinstance(raw, (str, np.str_)):
        return str(raw)
    raise GenerationError(field, f"expected text, got {type(raw).__name__}")


def _words(field: str, values) -> tuple[str, ...]:
    """Stop or banned words: empty strings dropped (clients send [""] for none), count and length bounded."""
    if values is None:
        return ()
    if isinstance(values, (str, bytes)):
        values = [values]
    elif isinstance(values, np.ndarray):
        values = values.ravel().tolist()
    elif not isinstance(values, list):
        raise GenerationError(field, f"expected text or a list of texts, got {type(values).__name__}")
    words = tuple(w for w in (_text(field, v) for v in values) if w)
    if len(words) > MAX_WORDS:
        raise GenerationError(field, f"{len(words)} words, over the limit of {MAX_WORDS}")
    for word in words:
        if len(word.encode()) > MAX_WORD_BYTES:
            raise GenerationError(field, f"a word of {len(word.encode())} bytes, over the limit of {MAX_WORD_BYTES}")
    return words


def _sampling_parameters(inputs: Mapping[str, np.ndarray]) -> dict:
    raw = _scalar(inputs, "sampling_parameters")
    if raw is None:
        return {}
    text = _text("sampling_parameters", raw)
    if len(text.encode()) > MAX_SAMPLING_PARAMETERS_BYTES:
        raise GenerationError("sampling_parameters", f"over the limit of {MAX_SAMPLING_PARAMETERS_BYTES} bytes")
    try:
        parsed = json.loads(text) if text.strip() else {}
    except ValueError as err:
        raise GenerationError("sampling_parameters", f"not JSON ({err})") from None
    if not isinstance(parsed, dict):
        raise GenerationError("sampling_parameters", f"expected a JSON object, got {type(parsed).__name__}")
    for key, value in parsed.items():
        field = f"sampling_parameters.{key}"
        if key not in SAMPLING_KEYS:
            raise GenerationError(field, f"unknown; known: {', '.join(SAMPLING_KEYS)}")
        if key in inputs:
            raise GenerationError(field, f"also given as the input {key}: give one")
        if isinstance(value, str) and key in _NUMERIC_KEYS:
            try:
                parsed[key] = float(value) if any(c in value for c in ".eE") else int(value)
            except ValueError:
                raise GenerationError(field, f"expected a number, got {value!r}") from None
        elif isinstance(value, str) and key == "ignore_eos" and value.lower() in ("true", "false"):
            parsed[key] = value.lower() == "true"
    return parsed


def _setting(inputs: Mapping[str, np.ndarray], sampling: dict, name: str) -> tuple[str, object]:
    """(the field name to report, the value) of one setting, from its input, its alias or sampling_parameters."""
    aliases = [alias for alias, canonical in ALIASES.items() if canonical == name and alias in inputs]
    if aliases and name in inputs:
        raise GenerationError(aliases[0], f"also given as {name}: give one")
    if aliases:
        return aliases[0], _scalar(inputs, aliases[0])
    if name in sampling:
        value = sampling[name]
        return f"sampling_parameters.{name}", value
    return name, _scalar(inputs, name)


def parse_generation(inputs: Mapping[str, np.ndarray], limits: GenerationLimits) -> GenerationRequest:
    """The request, or GenerationError naming the first bad field."""
    raw = _scalar(inputs, "text_input")
    if raw is None:
        raise GenerationError("text_input", "missing")
    # Measured before decoding: a huge prompt costs nothing more than its length check.
    if isinstance(raw, (bytes, np.bytes_)) and len(raw) > limits.max_prompt_bytes:
        raise GenerationError("text_input", f"{len(raw)} bytes, over the limit of {limits.max_prompt_bytes}")
    prompt = _text("text_input", raw)
    if len(prompt.encode("utf-8")) > limits.max_prompt_bytes:
        raise GenerationError("text_input", f"over the limit of {limits.max_prompt_bytes} bytes")
    if not prompt.strip():
        raise GenerationError("text_input", "empty prompt")
    for name in UNSUPPORTED_WHEN_TRUE:
        if _flag(name, _scalar(inputs, name), False):
            raise GenerationError(name, "not supported by this engine; send false or leave it out")
    for name in ALWAYS_RETURNED:
        _flag(name, _scalar(inputs, name), True)
    _number("beam_width", _scalar(inputs, "beam_width"), 1, int, 1, 1)
    sampling = _sampling_parameters(inputs)

    def number(name, default, kind, low, high):
        return _number(*_setting(inputs, sampling, name), default, kind, low, high)

    stop_field, stop = ("sampling_parameters.stop", sampling["stop"]) if "stop" in sampling else \
        ("stop_words", inputs.get("stop_words"))
    ignore_eos = sampling.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise GenerationError("sampling_parameters.ignore_eos", f"expected true or false, got {ignore_eos!r}")
    # TensorRT-LLM's min_length, vLLM's min_tokens: llama.cpp has no minimum, so any minimum ignores the end of
    # sequence and the answer runs to max_tokens or a stop word (genai-perf asks for min = max).
    minimum = number("min_tokens", 0, int, 0, limits.max_tokens_limit) if "min_tokens" in sampling else \
        _number("min_length", _scalar(inputs, "min_length"), 0, int, 0, limits.max_tokens_limit)
    exclude_input = _flag("exclude_input_in_output", _scalar(inputs, "exclude_input_in_output"), True)
    return GenerationRequest(
        prompt=prompt,
        max_tokens=number("max_tokens", limits.default_max_tokens, int, 1, limits.max_tokens_limit),
        temperature=number("temperature", 0.0, float, 0.0, 2.0),
        top_p=number("top_p", 1.0, float, 0.0, 1.0),
        top_k=number("top_k", 0, int, 0, 1000),
        seed=number("seed", -1, int, -1, 2**31 - 1),
        stream=_flag("stream", _scalar(inputs, "stream"), limits.stream_by_default),
        stop=_words(stop_field, stop),
        bad_words=_words("bad_words", inputs.get("bad_words")),
        ignore_eos=bool(ignore_eos) or minimum > 0,
        include_input=not exclude_input,
    )


def check_prompt_tokens(prompt_tokens: int, limits: GenerationLimits) -> None:
    if prompt_tokens > limits.max_prompt_tokens:
        raise GenerationError("text_input", f"{prompt_tokens} tokens, over the limit of {limits.max_prompt_tokens}")
