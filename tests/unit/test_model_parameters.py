import pytest

from backends.model_parameters import string_parameter

PARAMETERS = {"feature_spec": {"string_value": "../spec.json"}, "empty": {"string_value": ""}, "odd": {}}


@pytest.mark.parametrize("key, default, expected", [
    ("feature_spec", "", "../spec.json"),
    ("empty", "x", ""),  # set to the empty string is set: the default does not apply
    ("missing", 65536, "65536"),
    ("missing", "", ""),
    ("odd", "d", "d"),  # a parameter without string_value (Triton would not write one) falls back
])
def test_string_parameter(key, default, expected):
    assert string_parameter(PARAMETERS, key, default) == expected
