import numpy as np
import pytest
from hypothesis import given, strategies as st

from s2t.backends.runtime.request_rows import RequestRows


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=8))
def test_split_gives_each_request_its_own_rows_back_in_order(counts):
    arrays = [np.full((n, 2), i, dtype=np.int64) for i, n in enumerate(counts)]
    rows = RequestRows.of(arrays)
    joined = rows.join(arrays)
    assert rows.total == sum(counts) == len(joined)
    for original, part in zip(arrays, rows.split(joined), strict=True):
        assert np.array_equal(original, part)
    assert rows.owners().tolist() == [i for i, n in enumerate(counts) for _ in range(n)]


@pytest.mark.parametrize("counts, slices", [([1], [(0, 1)]), ([2, 0, 3], [(0, 2), (2, 2), (2, 5)])])
def test_slices_are_the_requests_ranges(counts, slices):
    assert [(s.start, s.stop) for s in RequestRows(counts).slices] == slices


def test_split_works_on_sequences_too():
    assert RequestRows([1, 2]).split(("a", "b", "c")) == [("a",), ("b", "c")]
