"""The legacy Skill services as processes, started the way an operator starts them (`s2t legacy serve`,
`s2t gateway`), each waited for until it says it listens, and failing fast with its output if it dies first."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager

import pytest

from s2t.clients.legacy_record import to_protobuf
from s2t.serve import service_process


def skill_records(german_credit_data, rows, prefix="legacy"):
    records = german_credit_data.records()
    return [to_protobuf({"request_id": f"{prefix}-{i}", "stream_id": "batch", "sequence_id": int(i),
                         "event_time_ms": 1_700_000_000_000 + int(i), "features": records[i]}) for i in rows]


def start(args: list[str], ready_prefix: str, timeout: float = 120.0) -> tuple[subprocess.Popen, str]:
    try:
        return service_process.start(args, ready_prefix, timeout)
    except service_process.ServiceError as err:
        pytest.fail(str(err))


stop = service_process.stop


@contextmanager
def running(args: list[str], ready_prefix: str):
    process, _ = start(args, ready_prefix)
    try:
        yield process
    finally:
        stop(process)
