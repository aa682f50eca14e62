"""TensorFlow's string hash buckets, computed without TensorFlow, bit for bit.

`tf.strings.to_hash_bucket_fast` (Keras `Hashing`, the out-of-vocabulary buckets of `StringLookup` and
`IntegerLookup`) is FarmHash Fingerprint64 of the UTF-8 bytes modulo the bucket count;
`tf.strings.to_hash_bucket_strong` (a salted `Hashing`) is SipHash-2-4 keyed by two 64-bit words, modulo the
bucket count. No ONNX operator computes either, so `s2t convert` lifts them into the feature spec and the decoder
computes the bucket from the string, as it looks vocabularies up. Both hashes are written out here in plain Python
(a few microseconds per feature value): the serving image needs no hashing package for them.
"""
from __future__ import annotations

import struct

FAST, STRONG = "fast", "strong"
_MASK = (1 << 64) - 1
# FarmHash's constants (farmhash.cc, namespace farmhashna, whose Hash64 is Fingerprint64).
_K0, _K1, _K2 = 0xC3A5C85C97CB3127, 0xB492B66FBE98F273, 0x9AE16A3B2F90404F


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _rotr(x: int, b: int) -> int:
    return x if b == 0 else ((x >> b) | (x << (64 - b))) & _MASK


def _fetch64(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 8], "little")


def _fetch32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "little")


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def _hash_len16(u: int, v: int, mul: int) -> int:
    a = ((u ^ v) * mul) & _MASK
    a ^= a >> 47
    b = ((v ^ a) * mul) & _MASK
    b ^= b >> 47
    return (b * mul) & _MASK


def _hash_len0to16(data: bytes) -> int:
    n = len(data)
    if n >= 8:
        mul = _K2 + n * 2
        a = (_fetch64(data, 0) + _K2) & _MASK
        b = _fetch64(data, n - 8)
        c = (_rotr(b, 37) * mul + a) & _MASK
        d = ((_rotr(a, 25) + b) * mul) & _MASK
        return _hash_len16(c, d, mul)
    if n >= 4:
        mul = _K2 + n * 2
        return _hash_len16((n + (_fetch32(data, 0) << 3)) & _MASK, _fetch32(data, n - 4), mul)
    if n > 0:
        y = data[0] + (data[n >> 1] << 8)
        z = n + (data[n - 1] << 2)
        return (_shift_mix(((y * _K2) ^ (z * _K0)) & _MASK) * _K2) & _MASK
    return _K2


def _hash_len17to32(data: bytes) -> int:
    n = len(data)
    mul = _K2 + n * 2
    a = (_fetch64(data, 0) * _K1) & _MASK
    b = _fetch64(data, 8)
    c = (_fetch64(data, n - 8) * mul) & _MASK
    d = (_fetch64(data, n - 16) * _K2) & _MASK
    return _hash_len16((_rotr((a + b) & _MASK, 43) + _rotr(c, 30) + d) & _MASK,
                       (a + _rotr((b + _K2) & _MASK, 18) + c) & _MASK, mul)


def _hash_len33to64(data: bytes) -> int:
    n = len(data)
    mul = _K2 + n * 2
    a = (_fetch64(data, 0) * _K2) & _MASK
    b = _fetch64(data, 8)
    c = (_fetch64(data, n - 8) * mul) & _MASK
    d = (_fetch64(data, n - 16) * _K2) & _MASK
    y = (_rotr((a + b) & _MASK, 43) + _rotr(c, 30) + d) & _MASK
    z = _hash_len16(y, (a + _rotr((b + _K2) & _MASK, 18) + c) & _MASK, mul)
    e = (_fetch64(data, 16) * mul) & _MASK
    f = _fetch64(data, 24)
    g = ((y + _fetch64(data, n - 32)) * mul) & _MASK
    h = ((z + _fetch64(data, n - 24)) * mul) & _MASK
    return _hash_len16((_rotr((e + f) & _MASK, 43) + _rotr(g, 30) + h) & _MASK,
                       (e + _rotr((f + a) & _MASK, 18) + g) & _MASK, mul)


def _weak_hash_len32_with_seeds(data: bytes, at: int, a: int, b: int) -> tuple[int, int]:
    w, x, y, z = (_fetch64(data, at + i) for i in (0, 8, 16, 24))
    a = (a + w) & _MASK
    b = _rotr((b + a + z) & _MASK, 21)
    c = a
    a = (a + x + y) & _MASK
    b = (b + _rotr(a, 44)) & _MASK
    return (a + z) & _MASK, (b + c) & _MASK


def fingerprint64(data: bytes) -> int:
    """FarmHash Fingerprint64 (farmhashna::Hash64), TensorFlow's `Fingerprint64` of a string."""
    n = len(data)
    if n <= 16:
        return _hash_len0to16(data)
    if n <= 32:
        return _hash_len17to32(data)
    if n <= 64:
        return _hash_len33to64(data)
    seed = 81
    y = (seed * _K1 + 113) & _MASK
    z = (_shift_mix((y * _K2 + 113) & _MASK) * _K2) & _MASK
    v, w = (0, 0), (0, 0)
    x = (seed * _K2 + _fetch64(data, 0)) & _MASK
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    for at in range(0, end, 64):
        x = (_rotr((x + y + v[0] + _fetch64(data, at + 8)) & _MASK, 37) * _K1) & _MASK
        y = (_rotr((y + v[1] + _fetch64(data, at + 48)) & _MASK, 42) * _K1) & _MASK
        x ^= w[1]
        y = (y + v[0] + _fetch64(data, at + 40)) & _MASK
        z = (_rotr((z + w[0]) & _MASK, 33) * _K1) & _MASK
        v = _weak_hash_len32_with_seeds(data, at, (v[1] * _K1) & _MASK, (x + w[0]) & _MASK)
        w = _weak_hash_len32_with_seeds(data, at + 32, (z + w[1]) & _MASK, (y + _fetch64(data, at + 16)) & _MASK)
        z, x = x, z
    mul = _K1 + ((z & 0xFF) << 1)
    at = last64
    w = ((w[0] + ((n - 1) & 63)) & _MASK, w[1])
    v = ((v[0] + w[0]) & _MASK, v[1])
    w = ((w[0] + v[0]) & _MASK, w[1])
    x = (_rotr((x + y + v[0] + _fetch64(data, at + 8)) & _MASK, 37) * mul) & _MASK
    y = (_rotr((y + v[1] + _fetch64(data, at + 48)) & _MASK, 42) * mul) & _MASK
    x ^= (w[1] * 9) & _MASK
    y = (y + v[0] * 9 + _fetch64(data, at + 40)) & _MASK
    z = (_rotr((z + w[0]) & _MASK, 33) * mul) & _MASK
    v = _weak_hash_len32_with_seeds(data, at, (v[1] * mul) & _MASK, (x + w[0]) & _MASK)
    w = _weak_hash_len32_with_seeds(data, at + 32, (z + w[1]) & _MASK, (y + _fetch64(data, at + 16)) & _MASK)
    z, x = x, z
    return _hash_len16((_hash_len16(v[0], w[0], mul) + _shift_mix(y) * _K0 + z) & _MASK,
                       (_hash_len16(v[1], w[1], mul) + x) & _MASK, mul)


def siphash24(key: tuple[int, int], data: bytes) -> int:
    """SipHash-2-4 with the 128-bit key given as its two little-endian 64-bit halves (k0, k1), as TensorFlow's
    StrongKeyedHash takes it."""
    k0, k1 = key[0] & _MASK, key[1] & _MASK
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rounds(n: int) -> None:
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & _MASK
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _MASK
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _MASK
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _MASK
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)

    tail_start = len(data) - len(data) % 8
    for (m,) in struct.iter_unpack("<Q", data[:tail_start]):
        v3 ^= m
        rounds(2)
        v0 ^= m
    # The last word: the remaining bytes, and the message length (mod 256) in the top byte.
    m = int.from_bytes(data[tail_start:], "little") | ((len(data) & 0xFF) << 56)
    v3 ^= m
    rounds(2)
    v0 ^= m
    v2 ^= 0xFF
    rounds(4)
    return v0 ^ v1 ^ v2 ^ v3


def hash_bucket(value: str, buckets: int, method: str = FAST, key: tuple[int, int] = (0, 0)) -> int:
    """The bucket TensorFlow gives `value` among `buckets` (0 .. buckets-1)."""
    data = value.encode("utf-8")
    if method == FAST:
        return fingerprint64(data) % buckets
    if method == STRONG:
        return siphash24(key, data) % buckets
    raise ValueError(f"unknown hash {method!r} (expected {FAST!r} or {STRONG!r})")
