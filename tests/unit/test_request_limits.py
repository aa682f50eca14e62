"""s2t/serve/request_limits.py: the largest request a server needs to read follows its models' configs."""
from __future__ import annotations

from pathlib import Path

import pytest

from s2t.serve.request_limits import BYTES_LENGTH_PREFIX, http_max_input_bytes, largest_batch


def _model(root: Path, name: str, config: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


@pytest.mark.parametrize("configs, expected", [
    ({}, 1),
    ({"a": 'name: "a"\nmax_batch_size: 0\n'}, 1),
    ({"a": "max_batch_size: 8\n", "b": "  max_batch_size : 256\ninput []\n"}, 256),
    # A parameter that merely mentions the words is not the setting.
    ({"a": 'parameters { key: "note" value: { string_value: "max_batch_size: 9999" } }\nmax_batch_size: 4\n'}, 4),
])
def test_the_largest_batch_is_read_from_every_config(tmp_path, configs, expected):
    for name, text in configs.items():
        _model(tmp_path, name, text)
    assert largest_batch([tmp_path]) == expected


def test_the_limit_is_a_full_batch_of_records_at_the_size_cap(tmp_path):
    _model(tmp_path / "one", "small", "max_batch_size: 8\n")
    _model(tmp_path / "two", "large", "max_batch_size: 64\n")
    assert http_max_input_bytes([tmp_path / "one", tmp_path / "two"], max_record_bytes=1000) == \
        64 * (1000 + BYTES_LENGTH_PREFIX)
