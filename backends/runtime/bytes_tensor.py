"""Triton's raw encoding of a BYTES tensor: each element as a 4-byte little-endian length, then its bytes.

The gateway sends records to Triton in this form as they arrived, and reads the `decision` output back from it,
without a tensor library in between. Inside a python model's stub, `stub_serializer` and `stub_deserializer` are
faster stand-ins for the python backend's own converters, which the stub calls for every BYTES tensor it builds or
receives (each request's `payload`, each response's `decision`).
"""
from __future__ import annotations

import struct
from typing import Callable

import numpy as np

_LENGTH = struct.Struct("<I")
_OBJECT = np.dtype(np.object_)


def encode(elements: list[bytes]) -> bytes:
    pack = _LENGTH.pack
    if len(elements) == 1:  # one record per request: most tensors hold one element
        return pack(len(elements[0])) + elements[0]
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


def stub_serializer(wheel_serialize: Callable) -> Callable:
    """The python backend's `serialize_byte_tensor` (a numpy BYTES tensor -> its raw encoding, in C order) for an
    object array of `bytes`, the form every model here builds, without the wheel's per-element numpy iterator
    (about 4 us for one element, a response's `decision`); any other input (str elements, `np.bytes_` arrays, an
    empty tensor) goes to `wheel_serialize`, so the result is always the wheel's."""
    def serialize_byte_tensor(array):
        if array.dtype is _OBJECT and array.size:
            if array.size == 1:
                element = array.item()
                if type(element) is bytes:
                    return _LENGTH.pack(len(element)) + element
            else:
                elements = array.ravel().tolist()
                if all(type(element) is bytes for element in elements):
                    return encode(elements)
        return wheel_serialize(array)
    serialize_byte_tensor.wheel = wheel_serialize
    return serialize_byte_tensor


def stub_deserializer(wheel_deserialize: Callable) -> Callable:
    """The python backend's `deserialize_bytes_tensor` (raw encoding, a uint8 array -> 1-D object array of
    `bytes`) without the wheel's struct format string per element (about 2 us for one element, a request's
    `payload`); an encoding that does not parse goes to `wheel_deserialize`, which raises its own error."""
    def deserialize_bytes_tensor(encoded):
        raw = encoded.tobytes() if isinstance(encoded, np.ndarray) else bytes(encoded)
        if len(raw) >= 4 and _LENGTH.unpack_from(raw)[0] + 4 == len(raw):
            elements = [raw[4:]]
        else:
            try:
                elements = decode(raw)
            except ValueError:
                return wheel_deserialize(encoded)
        array = np.empty(len(elements), dtype=_OBJECT)
        array[:] = elements
        return array
    deserialize_bytes_tensor.wheel = wheel_deserialize
    return deserialize_bytes_tensor
