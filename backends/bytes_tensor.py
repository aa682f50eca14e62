"""Triton's raw encoding of a BYTES tensor: each element as a 4-byte little-endian length, then its bytes.

The gateway sends records to Triton in this form as they arrived, and reads the `decision` output back from it,
without a tensor library in between.
"""
from __future__ import annotations

import struct

_LENGTH = struct.Struct("<I")


def encode(elements: list[bytes]) -> bytes:
    pack = _LENGTH.pack
    return b"".join(part for element in elements for part in (pack(len(element)), element))


def decode(raw: bytes) -> list[bytes]:
    """The elements; ValueError when `raw` is not a whole number of length-prefixed elements."""
    elements, offset, end = [], 0, len(raw)
    view = memoryview(raw)
    while offset < end:
        if offset + 4 > end:
            raise ValueError(f"BYTES tensor cut inside a length prefix at byte {offset}")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise ValueError(f"BYTES element of {length} bytes at byte {offset} runs past the end ({end})")
        elements.append(bytes(view[offset:offset + length]))
        offset += length
    return elements
