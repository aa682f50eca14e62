import numpy as np
import pytest

from s2t.backends.llm.generation_request import (GenerationError, GenerationLimits, GenerationRequest, check_prompt_tokens,
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


def words(*values):
    return np.array([v.encode() for v in values], dtype=object)


def test_tensorrt_llm_inputs_are_read_under_their_own_names():
    request = parse_generation({"text_input": tensor(b"hi"), "runtime_top_k": tensor(5, np.int32),
                                "runtime_top_p": tensor(0.5, np.float32), "random_seed": tensor(7, np.uint64),
                                "beam_width": tensor(1, np.int32), "stop_words": words("\n\n", "", "END"),
                                "bad_words": words(""), "exclude_input_in_output": tensor(False, np.bool_),
                                "return_log_probs": tensor(False, np.bool_),
                                "return_num_output_tokens": tensor(True, np.bool_)}, LIMITS)
    assert (request.top_k, request.seed, request.stop, request.bad_words) == (5, 7, ("\n\n", "END"), ())
    assert request.top_p == pytest.approx(0.5) and request.include_input
    assert request.sampling()["stop"] == ["\n\n", "END"] and "logit_bias" not in request.sampling()


def test_vllm_sampling_parameters_are_one_json_object():
    request = parse_generation({"text_input": tensor(b"hi"), "exclude_input_in_output": tensor(True, np.bool_),
                                "sampling_parameters": tensor(b'{"max_tokens": 12, "temperature": 0.5, "top_k": 3, '
                                                              b'"seed": 9, "stop": "STOP", "ignore_eos": true}')},
                               LIMITS)
    assert (request.max_tokens, request.top_k, request.seed, request.stop) == (12, 3, 9, ("STOP",))
    assert request.ignore_eos and not request.include_input and request.sampling()["ignore_eos"] is True
    assert parse_generation({"text_input": tensor(b"hi"), "sampling_parameters": tensor(b"")}, LIMITS).max_tokens == 64


def test_numbers_and_flags_may_come_as_strings_in_sampling_parameters_as_vllm_takes_them():
    request = parse_generation({"text_input": tensor(b"hi"), "sampling_parameters": tensor(
        b'{"max_tokens": "16", "min_tokens": "16", "temperature": "0.5", "ignore_eos": "false"}')}, LIMITS)
    assert (request.max_tokens, request.ignore_eos) == (16, True) and request.temperature == pytest.approx(0.5)


@pytest.mark.parametrize("minimum, ignore_eos", [(None, False), (0, False), (1, True), (16, True)])
def test_a_minimum_length_ignores_the_end_of_sequence(minimum, ignore_eos):
    inputs = {"text_input": tensor(b"hi"), "max_tokens": tensor(16, np.int32)}
    if minimum is not None:
        inputs["min_length"] = tensor(minimum, np.int32)
    assert parse_generation(inputs, LIMITS).ignore_eos is ignore_eos


def test_banned_words_become_llama_cpp_logit_biases():
    request = parse_generation({"text_input": tensor(b"hi"), "bad_words": words("credit", "loan")}, LIMITS)
    assert request.sampling()["logit_bias"] == [["credit", False], [" credit", False], ["loan", False],
                                                [" loan", False]]


@pytest.mark.parametrize("inputs, message", [
    ({"seed": tensor(1, np.int64), "random_seed": tensor(2, np.uint64)}, "random_seed: also given as seed"),
    ({"beam_width": tensor(4, np.int32)}, "beam_width: must be between 1 and 1, got 4"),
    ({"return_log_probs": tensor(True, np.bool_)}, "return_log_probs: not supported by this engine"),
    ({"return_generation_logits": tensor(True, np.bool_)}, "return_generation_logits: not supported"),
    ({"exclude_input_in_output": tensor(1, np.int32)}, "exclude_input_in_output: expected true or false"),
    ({"sampling_parameters": tensor(b"{not json")}, "sampling_parameters: not JSON"),
    ({"sampling_parameters": tensor(b"[1, 2]")}, "sampling_parameters: expected a JSON object, got list"),
    ({"sampling_parameters": tensor(b'{"best_of": 2}')}, "sampling_parameters.best_of: unknown; known: max_tokens"),
    ({"sampling_parameters": tensor(b'{"max_tokens": 0}')}, "sampling_parameters.max_tokens: must be between 1"),
    ({"sampling_parameters": tensor(b'{"temperature": "hot"}')}, "sampling_parameters.temperature: expected a number"),
    ({"sampling_parameters": tensor(b'{"ignore_eos": 1}')}, "sampling_parameters.ignore_eos: expected true or false"),
    ({"sampling_parameters": tensor(b'{"max_tokens": "many"}')}, "sampling_parameters.max_tokens: expected a number"),
    ({"min_length": tensor(600, np.int32)}, "min_length: must be between 0 and 512"),
    ({"sampling_parameters": tensor(b'{"stop": 5}')}, "sampling_parameters.stop: expected text or a list"),
    ({"sampling_parameters": tensor(b'{"max_tokens": 8}'), "max_tokens": tensor(8, np.int32)},
     "sampling_parameters.max_tokens: also given as the input max_tokens"),
    ({"sampling_parameters": tensor(b"{" + b" " * 5000 + b"}")}, "sampling_parameters: over the limit of 4096"),
    ({"stop_words": words(*"abcdefghi")}, "stop_words: 9 words, over the limit of 8"),
    ({"bad_words": words("x" * 129)}, "bad_words: a word of 129 bytes, over the limit of 128"),
    ({"stop_words": np.array([b"\xff"], dtype=object)}, "stop_words: not UTF-8"),
])
def test_bad_convention_inputs_are_named_with_the_reason(inputs, message):
    with pytest.raises(GenerationError, match=message.replace("(", r"\(")):
        parse_generation({"text_input": tensor(b"hi"), **inputs}, LIMITS)
