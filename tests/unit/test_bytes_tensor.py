import struct

import pytest
from hypothesis import given, strategies as st

from backends import bytes_tensor


@given(st.lists(st.binary(max_size=300), max_size=40))
def test_elements_come_back_as_they_went(elements):
    assert bytes_tensor.decode(bytes_tensor.encode(elements)) == elements


@pytest.mark.parametrize("raw, elements", [
    (b"", []), (struct.pack("<I", 0), [b""]), (struct.pack("<I", 3) + b"abc" + struct.pack("<I", 1) + b"z", [b"abc", b"z"]),
])
def test_the_layout_is_a_little_endian_length_before_each_element(raw, elements):
    assert bytes_tensor.encode(elements) == raw and bytes_tensor.decode(raw) == elements


@pytest.mark.parametrize("raw, message", [(b"\x01\x00", "inside a length prefix"),
                                          (struct.pack("<I", 9) + b"short", "runs past the end")])
def test_a_cut_tensor_is_refused_with_where(raw, message):
    with pytest.raises(ValueError, match=message):
        bytes_tensor.decode(raw)
