"""How large a request Triton's own endpoints should take, from what the served models can use.

A record is at most 64 KiB (backends/records/record_decoder.py) and a request holds at most `max_batch_size` of
them, each
serialized as a BYTES element (a 4-byte length, then the bytes): nothing larger can be a valid request, so nothing
larger needs to be read. Triton 2.59 and later take this as `--http-max-input-size`; the embedded 2.51 has no such
option, and no Triton release limits the size of a gRPC message (see docs/reliability.md): on the embedded server the
gRPC front (s2t/serve/grpc_front.py) does.
"""
from __future__ import annotations

import re
from pathlib import Path

from s2t.backends.records.record_decoder import DEFAULT_MAX_RECORD_BYTES

BYTES_LENGTH_PREFIX = 4
# What a gRPC inference request holds besides its tensors' bytes (model name, tensor names, shapes, parameters).
GRPC_ENVELOPE_BYTES = 64 * 1024
_MAX_BATCH = re.compile(r"^\s*max_batch_size\s*:\s*(\d+)", re.MULTILINE)


def largest_batch(repositories: list[Path]) -> int:
    """The largest `max_batch_size` of any model in `repositories` (1 for models that do not batch)."""
    sizes = [int(m.group(1)) for repository in repositories for config in Path(repository).glob("*/config.pbtxt")
             for m in _MAX_BATCH.finditer(config.read_text())]
    return max([1, *sizes])


def http_max_input_bytes(repositories: list[Path], max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
    return largest_batch(repositories) * (max_record_bytes + BYTES_LENGTH_PREFIX)


def grpc_max_message_bytes(repositories: list[Path], max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
    """The largest valid gRPC request: the HTTP limit's tensor bytes (as `raw_input_contents`, or as `bytes_contents`
    elements, whose tag and length take no more than the 4-byte prefix) and the message around them."""
    return http_max_input_bytes(repositories, max_record_bytes) + GRPC_ENVELOPE_BYTES
