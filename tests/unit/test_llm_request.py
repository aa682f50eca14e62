import numpy as np
import pytest

from backends.llm_request import (GenerationError, GenerationLimits, GenerationRequest, check_prompt_tokens,
                                  parse_generation)

LIMITS = GenerationLimits(max_tokens_limit=512, default_max_tokens=64, max_prompt_tokens=1024, max_prompt_bytes=100)


def tensor(value, dtype=None):
    return np.array([value], dtype=dtype if dtype is not None else (object if isinstance(value, bytes) else None))


def test_a_prompt_alone_takes_the_defaults():
    assert parse_generation({"text_input": tensor(b"hello")}, LIMITS) == GenerationRequest("hello", 64)


def test_sampling_parameters_and_stream_are_read():
    request = parse_generation({"text_input": tensor(b"hi"), "max_tokens": tensor(8, np.int32),
                                "temperature": tensor(0.7, np.float32), "top_p": tensor(0.9, np.float32),
                                "top_k": tensor(40, np.int32), "seed": tensor(3, np.int64),
                                "stream": tensor(False, np.bool_)}, LIMITS)
    assert (request.max_tokens, request.top_k, request.seed, request.stream) == (8, 40, 3, False)
    assert request.temperature == pytest.approx(0.7) and request.top_p == pytest.approx(0.9)


@pytest.mark.parametrize("inputs, message", [
    ({}, "text_input: missing"),
    ({"text_input": tensor(b"")}, "text_input: empty prompt"),
    ({"text_input": tensor(b"  \n\t")}, "text_input: empty prompt"),
    ({"text_input": tensor(b"x" * 101)}, "text_input: 101 bytes, over the limit of 100"),
    ({"text_input": tensor(b"\xff\xfe")}, "text_input: not UTF-8"),
    ({"text_input": np.array([b"a", b"b"], dtype=object)}, "text_input: expected one value, got 2"),
    ({"text_input": tensor(b"hi"), "max_tokens": tensor(0, np.int32)}, "max_tokens: must be between 1 and 512"),
    ({"text_input": tensor(b"hi"), "max_tokens": tensor(513, np.int32)}, "max_tokens: must be between 1 and 512"),
    ({"text_input": tensor(b"hi"), "max_tokens": tensor(-1, np.int32)}, "max_tokens: must be between 1 and 512"),
    ({"text_input": tensor(b"hi"), "temperature": tensor(np.nan, np.float32)}, "temperature: must be between"),
    ({"text_input": tensor(b"hi"), "top_p": tensor(1.5, np.float32)}, "top_p: must be between 0.0 and 1.0"),
    ({"text_input": tensor(b"hi"), "max_tokens": tensor(b"8")}, "max_tokens: expected a number, got bytes"),
])
def test_bad_fields_are_named_with_the_reason(inputs, message):
    with pytest.raises(GenerationError, match=message.replace("(", r"\(")):
        parse_generation(inputs, LIMITS)


def test_a_prompt_over_the_token_cap_is_refused():
    check_prompt_tokens(1024, LIMITS)
    with pytest.raises(GenerationError, match="text_input: 1025 tokens, over the limit of 1024"):
        check_prompt_tokens(1025, LIMITS)
