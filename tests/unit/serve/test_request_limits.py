"""s2t/serve/request_limits.py: the largest request a server needs to read follows its models' configs."""
from __future__ import annotations

from pathlib import Path

import pytest

from s2t.serve.request_limits import (BYTES_LENGTH_PREFIX, GRPC_ENVELOPE_BYTES, grpc_max_message_bytes,
                                      http_max_input_bytes, largest_batch)


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


@pytest.mark.parametrize("encoding", ["raw_input_contents", "bytes_contents"])
def test_a_full_batch_of_records_at_the_size_cap_fits_the_grpc_limit_either_way_it_is_encoded(tmp_path, encoding):
    from tritonclient.grpc import service_pb2

    _model(tmp_path, "pipeline", "max_batch_size: 16\n")
    records = [b"x" * 1000] * 16
    request = service_pb2.ModelInferRequest(model_name="risk_pipeline_with_a_long_name", id="request-" + "9" * 64)
    tensor = request.inputs.add(name="payload", datatype="BYTES", shape=[16, 1])
    if encoding == "raw_input_contents":
        request.raw_input_contents.append(b"".join(len(r).to_bytes(4, "little") + r for r in records))
    else:
        tensor.contents.bytes_contents.extend(records)
    for name in ("probability", "decision"):
        request.outputs.add(name=name)
    limit = grpc_max_message_bytes([tmp_path], max_record_bytes=1000)
    assert request.ByteSize() <= limit < request.ByteSize() + GRPC_ENVELOPE_BYTES + 1
