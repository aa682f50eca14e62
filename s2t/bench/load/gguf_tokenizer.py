"""A Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json) written from a GGUF file's own metadata,
offline: genai-perf counts prompt and answer tokens with a transformers tokenizer, and the served model's is in its
GGUF file (llama.cpp's BPE vocabulary, merges and special tokens).

Run with an interpreter that has the `gguf` and `tokenizers` packages (the genai-perf environment):
`python s2t/bench/load/gguf_tokenizer.py MODEL.gguf OUT_DIR`. Standalone on purpose: nothing from s2t is imported.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) whose splitting is GPT-2's byte-level regex, with digits
# split one by one for those listed in DIGITS_ALONE.
GPT2_LIKE = {"gpt2", "default", "smollm", "starcoder", "refact", "gpt-2"}
DIGITS_ALONE = {"smollm", "starcoder", "refact"}
CONTROL = 3  # llama.cpp token type: special (control) token


class TokenizerError(ValueError):
    pass


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def tokenizer_from_gguf(path: Path):
    """A `tokenizers.Tokenizer` and its transformers config for the GGUF file's BPE vocabulary."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    reader = gguf.GGUFReader(str(path))
    kind, pre = _field(reader, "tokenizer.ggml.model"), _field(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in GPT2_LIKE:
        raise TokenizerError(f"{path.name}: tokenizer {kind!r} (pre {pre!r}) is not a GPT-2 style BPE this writer "
                             f"knows ({', '.join(sorted(GPT2_LIKE))})")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     fuse_unk=False, byte_fallback=False))
    splitters = [pre_tokenizers.Digits(individual_digits=True)] if pre in DIGITS_ALONE else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splitters, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == CONTROL])

    def token(key):
        index = _field(reader, key)
        return None if index is None else tokens[int(index)]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, "clean_up_tokenization_spaces":
              False, "bos_token": token("tokenizer.ggml.bos_token_id"), "eos_token": token("tokenizer.ggml.eos_token_id"),
              "unk_token": token("tokenizer.ggml.unknown_token_id"), "pad_token": token("tokenizer.ggml.padding_token_id")}
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tokenizer, {k: v for k, v in config.items() if v is not None}


def write_tokenizer(gguf_path: Path, out_dir: Path) -> Path:
    tokenizer, config = tokenizer_from_gguf(gguf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in config}, indent=1))
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_tokenizer.py MODEL.gguf OUT_DIR")
    try:
        print(write_tokenizer(Path(sys.argv[1]), Path(sys.argv[2])))
    except TokenizerError as err:
        sys.exit(str(err))
