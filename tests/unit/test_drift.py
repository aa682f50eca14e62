import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.drift import psi


@pytest.mark.parametrize("expected, actual, low, high", [
    ([10, 20, 30, 40], [10, 20, 30, 40], 0.0, 1e-12),
    ([10, 20, 30, 40], [20, 40, 60, 80], 0.0, 1e-12),  # same shares, more records
    ([25, 25, 25, 25], [40, 30, 20, 10], 0.1, 0.25),
    ([50, 50, 0, 0], [0, 0, 50, 50], 5.0, 50.0),
])
def test_psi_is_zero_for_equal_shares_and_grows_with_the_shift(expected, actual, low, high):
    assert low <= psi(expected, actual) <= high


def test_psi_of_an_empty_side_is_not_a_number():
    assert math.isnan(psi([0, 0], [1, 2]))


def test_psi_refuses_different_bins():
    with pytest.raises(ValueError, match="bins differ"):
        psi([1, 2], [1, 2, 3])


@given(st.lists(st.integers(0, 1000), min_size=2, max_size=20).filter(lambda c: sum(c) > 0),
       st.lists(st.integers(0, 1000), min_size=2, max_size=20).filter(lambda c: sum(c) > 0))
def test_psi_is_symmetric_and_never_negative(a, b):
    a, b = a[:min(len(a), len(b))], b[:min(len(a), len(b))]
    if sum(a) == 0 or sum(b) == 0:
        return
    assert psi(a, b) >= 0 and np.isclose(psi(a, b), psi(b, a))
