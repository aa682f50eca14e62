import importlib.util
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

from s2t.backends.runtime import bytes_tensor
from tests.unit.python_backend import WHEEL_UTILS


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


def _wheel():
    """The wheel's triton_python_backend_utils as it ships: its converters are the reference."""
    spec = importlib.util.spec_from_file_location("wheel_backend_utils", WHEEL_UTILS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WHEEL = _wheel()
SERIALIZE = bytes_tensor.stub_serializer(WHEEL.serialize_byte_tensor)
DESERIALIZE = bytes_tensor.stub_deserializer(WHEEL.deserialize_bytes_tensor)


@given(st.lists(st.one_of(st.binary(max_size=50), st.text(max_size=20)), max_size=12),
       st.sampled_from([(-1,), (-1, 1), (1, -1)]))
def test_the_stubs_serializer_gives_the_wheels_bytes_for_any_tensor(elements, shape):
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    array = array.reshape(shape) if elements else array
    assert SERIALIZE(array) == WHEEL.serialize_byte_tensor(array)


@given(st.binary(max_size=80))
def test_the_stubs_deserializer_gives_the_wheels_elements_or_its_error_for_any_bytes(raw):
    encoded = np.frombuffer(raw, dtype=np.uint8)
    try:
        expected = WHEEL.deserialize_bytes_tensor(encoded)
    except struct.error as err:
        with pytest.raises(struct.error, match=str(err).split(" ")[0]):
            DESERIALIZE(encoded)
        return
    found = DESERIALIZE(encoded)
    assert found.dtype == expected.dtype and found.shape == expected.shape and found.tolist() == expected.tolist()


def test_a_numpy_bytes_array_and_an_empty_tensor_go_to_the_wheels_serializer():
    for array in (np.array([b"ab", b"c"]), np.array([], dtype=object)):
        assert SERIALIZE(array) == WHEEL.serialize_byte_tensor(array)
