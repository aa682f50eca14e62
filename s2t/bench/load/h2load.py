"""A gRPC load generator that costs the server's cores little: nghttp2's h2load sending Triton's ModelInfer as raw
gRPC frames over HTTP/2 streams on one connection, as a gRPC channel multiplexes its calls.

perf_analyzer's gRPC client spends several times wrk's CPU per request; on two shared cores that CPU is taken from
the server, so a gRPC-against-HTTP comparison with it measures the clients as much as Triton. h2load is C, like wrk.
It sends one body again and again (one real record), and it sees HTTP statuses only (a gRPC error travels in an
HTTP/2 200's trailers, and h2load counts it as a success): its `requests` are never answers; count answers with
Triton's statistics (load/generators.py does).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from s2t.backends.runtime import bytes_tensor

SERVICE_PATH = "/inference.GRPCInferenceService/ModelInfer"


def infer_body(model: str, input_name: str, record: bytes) -> bytes:
    """One gRPC message (uncompressed flag, 4-byte big-endian length, the ModelInferRequest) of one record."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = input_name, "BYTES"
    tensor.shape.extend([1, 1])
    request.raw_input_contents.append(bytes_tensor.encode([record]))
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass(frozen=True)
class H2loadResult:
    requests: int  # HTTP 200s, gRPC errors included (they are in the trailers): not answers
    seconds: float
    failed: int
    mean_ms: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("nan")


_FINISHED = re.compile(r"^finished in ([\d.]+)(ms|s),")
_REQUESTS = re.compile(r"^requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
                       r"(\d+) timeout")
_TIME_FOR_REQUEST = re.compile(r"^time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)\s")
_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse(output: str) -> H2loadResult:
    seconds = succeeded = failed = None
    mean_ms = float("nan")
    for line in output.splitlines():
        line = line.strip()
        if found := _FINISHED.match(line):
            seconds = float(found[1]) * _UNIT_SECONDS[found[2]]
        elif found := _REQUESTS.match(line):
            succeeded, failed = int(found[1]), int(found[2]) + int(found[3]) + int(found[4])
        elif found := _TIME_FOR_REQUEST.match(line):
            mean_ms = float(found[1]) * _UNIT_SECONDS[found[2]] * 1e3
    if seconds is None or succeeded is None:
        raise RuntimeError(f"h2load printed no result:\n{output[-2000:]}")
    return H2loadResult(succeeded, seconds, failed, mean_ms)


def run(grpc_url: str, body: Path, streams: int, seconds: float) -> H2loadResult:
    """`streams` calls in flight on one connection for `seconds` (at least 1)."""
    h2load = shutil.which("h2load")
    if h2load is None:
        raise RuntimeError("h2load is not installed (Debian package `nghttp2-client`)")
    proc = subprocess.run([h2load, "-D", str(max(1, round(seconds))), "-c", "1", "-t", "1", "-m", str(streams),
                           "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers",
                           f"http://{grpc_url}{SERVICE_PATH}"], capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"h2load failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return parse(proc.stdout)
