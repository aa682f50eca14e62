"""Single requests that kill tritonserver 2.51 (the embedded server), kept as data so that tests can replay them
against whatever stands in front of Triton and check that it refuses them and that Triton lives on.

Each entry was sent, alone, to a fresh tritonserver 2.51 started by TritonServer on this repository's models; `seen`
says what happened to that process. `fixed_in` names the upstream change that removed the cause, `in_25_08` whether
Triton 2.60 (NGC 25.08) still has it, and `refuse` how a front can turn the request away without understanding more
of it than the wire.

Bodies that are large or slow to build are functions, so importing this module costs nothing. Two are heavy to
replay: gzip_body_past_2_gib makes the receiver inflate 2 GiB, and gzip_body_that_fails_leaks_its_inflated_size
costs its receiver 300 MB a send. `send_http` speaks raw HTTP/1.1 over a socket because several entries are
malformed in ways that HTTP clients would correct (a chunked body cut into a million pieces, a header value no
client would write).
"""
from __future__ import annotations

import json
import os
import socket
import struct
import zlib
from dataclasses import dataclass, field
from typing import Callable

# What a process killed by each of these looks like (Popen.returncode).
SIGABRT, SIGSEGV, SIGFPE = -6, -11, -8


@dataclass(frozen=True)
class HttpCrash:
    name: str
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    # The body, or a function that builds it (large or slow to build).
    body: bytes | Callable[[], bytes]
    why: str
    seen: str
    returncode: int | None
    fixed_in: str
    in_25_08: bool
    refuse: str
    # Send the body as this many chunks of Transfer-Encoding: chunked (0: one Content-Length body).
    chunks: int = 0

    def payload(self) -> bytes:
        return self.body() if callable(self.body) else self.body


@dataclass(frozen=True)
class GrpcCrash:
    name: str
    # The full method name, e.g. "/inference.GRPCInferenceService/ModelInfer".
    method: str
    # Builds the request messages (tritonclient.grpc.service_pb2) in the order they are sent.
    requests: Callable[[], list]
    metadata: tuple[tuple[str, str], ...]
    why: str
    seen: str
    returncode: int | None
    fixed_in: str
    in_25_08: bool
    refuse: str
    # Our public gRPC port answers ModelInfer itself and relays the rest to Triton's own endpoint.
    reaches_triton_through_front: bool = True
    extra: dict = field(default_factory=dict)


def _infer_json(inputs: list[dict], outputs: list[dict] | None = None) -> bytes:
    request: dict = {"inputs": inputs}
    if outputs is not None:
        request["outputs"] = outputs
    return json.dumps(request).encode()


# A record risk_pipeline scores (the first row of the German credit data).
PAYLOAD_RECORD = json.dumps({"features": {
    "status_of_existing_checking_account": "... < 0 DM",
    "credit_history": "critical account/ other credits existing (not at this bank)", "purpose": "radio/television",
    "savings_account_and_bonds": "unknown/ no savings account", "present_employment_since": "... >= 7 years",
    "personal_status_and_sex": "male : divorced/separated", "other_debtors_or_guarantors": "none",
    "property": "real estate", "other_installment_plans": "none", "housing": "own",
    "job": "skilled employee / official", "telephone": "yes, registered under the customers name",
    "foreign_worker": "yes", "duration_in_month": 6, "credit_amount": 1169,
    "installment_rate_in_percentage_of_disposable_income": 4, "present_residence_since": 4, "age_in_years": 67,
    "number_of_existing_credits_at_this_bank": 2, "number_of_people_being_liable_to_provide_maintenance_for": 1}})
VALID_PIPELINE_BODY = _infer_json([{"name": "payload", "datatype": "BYTES", "shape": [1, 1],
                                    "data": [PAYLOAD_RECORD]}])


def _nested_array_body(depth: int = 1_000_000) -> bytes:
    return b"[" * depth + b"]" * depth


def _nested_data_body(depth: int = 1_000_000) -> bytes:
    head = b'{"inputs":[{"name":"payload","datatype":"BYTES","shape":[1,1],"data":'
    return head + b"[" * depth + b"]" * depth + b"}]}"


def _gzip_zeros(size: int) -> bytes:
    """A gzip stream of `size` zero bytes, deflated once per 64 MB block rather than once per byte: after a full
    flush the deflate state starts afresh, so every whole block of zeros deflates to the same bytes, and the stream is
    the header, that block's bytes repeated, the rest deflated as the final block, and the trailer (CRC-32, size)."""
    block = bytes(64 << 20)
    whole, rest = divmod(size, len(block))
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    first = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    header, deflated = first[:-len(again)], again
    assert first.endswith(again) and len(header) == 10, "a full flush did not restart the deflate state"
    last = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: its blocks follow the flushed ones
    final = last.compress(block[:rest]) + last.flush()
    crc = 0
    for _ in range(whole):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(block[:rest], crc)
    return header + deflated * whole + final + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _gzip_random(size: int) -> bytes:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    return compressor.compress(os.urandom(size)) + compressor.flush()


def _gzip_past_int32() -> bytes:
    return _gzip_zeros((1 << 31) + (64 << 20))


def _risk_pipeline_request(record: str, request_id: str = "", classification: int | None = None):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name="risk_pipeline", id=request_id)
    tensor = request.inputs.add(name="payload", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.append(record.encode())
    if classification is not None:
        output = request.outputs.add(name="decision")
        output.parameters["classification"].int64_param = classification
    return request


def _stream_with_failing_records(count: int = 64, every: int = 7) -> list:
    return [_risk_pipeline_request("not a record" if i % every == every - 1 else PAYLOAD_RECORD, f"r{i}")
            for i in range(count)]


JSON = (("Content-Type", "application/json"),)
GZIP = (("Content-Type", "application/json"), ("Content-Encoding", "gzip"))
INFER = "/v2/models/risk_pipeline/infer"

HTTP_CRASHES: list[HttpCrash] = [
    HttpCrash(
        name="accept_encoding_weight_out_of_range",
        method="POST", path=INFER, headers=(*JSON, ("Accept-Encoding", "gzip;q=1e999")), body=VALID_PIPELINE_BODY,
        why="the q weight is parsed with std::stod, whose std::out_of_range nobody catches (response compression "
            "is chosen for every infer and generate request of a loaded model, before the body is read)",
        seen="SIGABRT: terminate called after throwing an instance of 'std::out_of_range' what(): stod",
        returncode=SIGABRT,
        fixed_in="server 5ae91e8a6 'Catch potential out of range exception' (#8637), first in v2.66.0",
        in_25_08=True,
        refuse="a qvalue that is not 0-1 with at most three decimals (RFC 9110 12.4.2) is a 400, or the edge "
               "relays its own Accept-Encoding"),
    HttpCrash(
        name="accept_encoding_weight_out_of_range_generate",
        method="POST", path="/v2/models/risk_pipeline/generate",
        headers=(*JSON, ("Accept-Encoding", "identity;q=1e400")),
        body=json.dumps({"payload": PAYLOAD_RECORD}).encode(),
        why="the same std::stod on the generate endpoint (and generate_stream)",
        seen="SIGABRT: terminate called after throwing an instance of 'std::out_of_range' what(): stod",
        returncode=SIGABRT,
        fixed_in="server 5ae91e8a6 (#8637), first in v2.66.0",
        in_25_08=True,
        refuse="as accept_encoding_weight_out_of_range"),
    HttpCrash(
        name="json_input_shape_past_memory",
        method="POST", path="/v2/models/risk_scorer/infer", headers=JSON,
        body=_infer_json([{"name": "numeric", "datatype": "FP32", "shape": [1 << 40, 7], "data": [0.0]}]),
        why="a JSON input's buffer is sized from its shape (element count x 4 bytes, 30 TB here) before the data "
            "is counted; the std::bad_alloc is not caught",
        seen="SIGABRT: terminate called after throwing an instance of 'std::bad_alloc'",
        returncode=SIGABRT,
        fixed_in="server d6750e893 'Update element count handling' (#8182, v2.58.0) and af8bb9302 'Update "
                 "handling of large array sizes' (#8174, v2.59.0: byte size above --http-max-input-size refused)",
        in_25_08=False,
        refuse="the product of a JSON input's shape must equal the number of values in 'data', and its first "
               "dimension must not exceed the model's max_batch_size"),
    HttpCrash(
        name="deeply_nested_json_infer",
        method="POST", path=INFER, headers=JSON, body=_nested_data_body,
        why="rapidjson parses recursively (TritonJson::Parse): a million nested arrays (2 MB) overflow the "
            "HTTP worker's stack before any check runs",
        seen="SIGSEGV (no message: the stack is gone)",
        returncode=SIGSEGV,
        fixed_in="common 3898bba 'Switch Triton JSON parsing to iterative mode for deep nesting' (#156, r26.05); "
                 "server f46557bec (#8172, v2.58.0) limits depth only in the walk over 'data' after parsing",
        in_25_08=True,
        refuse="JSON nested deeper than a small limit (the KServe v2 body needs 4 levels plus the tensor's rank) "
               "is a 400, checked by a scanner that does not recurse"),
    HttpCrash(
        name="deeply_nested_json_repository_index",
        method="POST", path="/v2/repository/index", headers=JSON, body=_nested_array_body,
        why="the same recursive parse on the repository index route, which answers anyone when no admin key is "
            "configured",
        seen="SIGSEGV",
        returncode=SIGSEGV,
        fixed_in="common 3898bba (#156, r26.05)",
        in_25_08=True,
        refuse="as deeply_nested_json_infer, on every route with a JSON body"),
    HttpCrash(
        name="chunked_body_of_a_million_chunks",
        method="POST", path=INFER, headers=JSON, body=VALID_PIPELINE_BODY + b" " * 1_100_000, chunks=1_100_000,
        why="each chunk becomes its own evbuffer segment and the infer handler alloca()s 16 bytes per segment "
            "on an 8 MB stack; 6.6 MB on the wire",
        seen="SIGSEGV: Signal (11) received",
        returncode=SIGSEGV,
        fixed_in="server ad72741a8 'Enhance memory allocation security in HTTP ... request handler' (#8305, "
                 "v2.60.0: no alloca); 13480cbf3 'Cap chunked HTTP request chunk count at 65536' (#8770, v2.69.0)",
        in_25_08=False,
        refuse="the edge reads the whole body (bounded) and relays it with a Content-Length; on 2.60 the chunks "
               "still cost about 1 KB of memory each (400,000 one-byte chunks: +405 MB peak on 2.51)"),
    HttpCrash(
        name="chunked_gzip_body_of_a_million_chunks",
        method="POST", path=INFER, headers=GZIP, body=lambda: _gzip_random(1_100_000), chunks=1_100_000,
        why="the decompressor alloca()s 16 bytes per input segment (DataCompressor::DecompressData); it runs "
            "before anything else reads the body",
        seen="SIGSEGV: Signal (11) received",
        returncode=SIGSEGV,
        fixed_in="server e0c5dc91e 'Replace Use of alloca' (#8411, v2.62.0)",
        in_25_08=True,
        refuse="Content-Encoding other than identity is a 415, and the body is relayed with a Content-Length"),
    HttpCrash(
        name="gzip_body_past_2_gib",
        method="POST", path=INFER, headers=GZIP, body=_gzip_past_int32,
        why="2 MB of gzip inflate to 2.06 GiB, whose length no longer fits the int32 content length; the "
            "negative length becomes a size_t header length and the JSON buffer's resize throws",
        seen="SIGABRT: terminate called after throwing an instance of 'std::length_error' "
             "what(): vector::_M_default_append (peak RSS above 2 GB first)",
        returncode=SIGABRT,
        fixed_in="server cd0e3a676 'Set memory decompression limit' (#8570, v2.65.0: inflated size capped at "
                 "--http-max-input-size)",
        in_25_08=True,
        refuse="Content-Encoding other than identity is a 415 (or the edge inflates with a cap)"),
    HttpCrash(
        name="gzip_body_that_fails_leaks_its_inflated_size",
        method="POST", path=INFER, headers=GZIP, body=lambda: _gzip_zeros(300 << 20),
        why="300 KB of gzip inflate to 300 MB that are not JSON: the 500 returns before the inflated buffer is "
            "freed, so every such request keeps 300 MB (5 requests: RSS 106 -> 1613 MB); a client repeating it "
            "exhausts memory. One inflate of 1.5 GB alone peaked at 3 GB RSS (the JSON copy)",
        seen="no signal: HTTP 500 'failed to parse the request JSON buffer', RSS +300 MB per request, never "
             "returned",
        returncode=None,
        fixed_in="server 669cef083 'Prevent memory retention on failed compressed HTTP requests' (#8764, "
                 "v2.69.0); cd0e3a676 (#8570, v2.65.0) caps the inflated size",
        in_25_08=True,
        refuse="Content-Encoding other than identity is a 415"),
    HttpCrash(
        name="classification_of_bytes_output",
        method="POST", path=INFER, headers=JSON,
        body=_infer_json([{"name": "payload", "datatype": "BYTES", "shape": [1, 1], "data": [PAYLOAD_RECORD]}],
                         [{"name": "decision", "parameters": {"classification": 5}}]),
        why="the classification divides the output's byte size by its element size, which is 0 for BYTES",
        seen="SIGFPE (Fatal Python error: Floating point exception)",
        returncode=SIGFPE,
        fixed_in="server 251f8ae4b 'Improve data type validation for classification' (#8267), first in v2.60.0",
        in_25_08=False,
        refuse="a 'classification' parameter on an output whose datatype is BYTES is a 400 (simplest: on any "
               "output of these models)"),
]

GRPC_CRASHES: list[GrpcCrash] = [
    GrpcCrash(
        name="stream_in_triton_grpc_error_mode_with_failing_requests",
        method="/inference.GRPCInferenceService/ModelStreamInfer",
        requests=_stream_with_failing_records,
        metadata=(("triton_grpc_error", "true"),),
        why="in triton_grpc_error mode the first error response closes the stream and frees its state while the "
            "stream's other requests are in flight; their completions then use freed memory. Sent twice in a row "
            "(two streams of 64 requests, every 7th not a valid record). Without the header: 40 streams, no harm",
        seen="SIGSEGV (Fatal Python error: Segmentation fault) on the second stream, on Triton's own gRPC port "
             "and through our gRPC front, which forwards the header",
        returncode=SIGSEGV,
        fixed_in="server c1b7cb73c 'UAF in gRPC streaming \"triton_grpc_error\" mode' (#8708), first in v2.68.0",
        in_25_08=True,
        refuse="the front drops the triton_grpc_error metadata (or refuses a stream that carries it) before "
               "relaying"),
    GrpcCrash(
        name="classification_of_bytes_output_unary",
        method="/inference.GRPCInferenceService/ModelInfer",
        requests=lambda: [_risk_pipeline_request(PAYLOAD_RECORD, classification=5)],
        metadata=(),
        why="as the HTTP classification_of_bytes_output",
        seen="SIGFPE on Triton's own gRPC port; our front answers ModelInfer itself and refuses it "
             "(INVALID_ARGUMENT)",
        returncode=SIGFPE,
        fixed_in="server 251f8ae4b (#8267), first in v2.60.0",
        in_25_08=False,
        refuse="already refused by the front",
        reaches_triton_through_front=False),
    GrpcCrash(
        name="classification_of_bytes_output_stream",
        method="/inference.GRPCInferenceService/ModelStreamInfer",
        requests=lambda: [_risk_pipeline_request(PAYLOAD_RECORD, classification=5)],
        metadata=(),
        why="as the HTTP classification_of_bytes_output, on a stream",
        seen="SIGFPE on Triton's own gRPC port; through our front: INVALID_ARGUMENT, Triton alive",
        returncode=SIGFPE,
        fixed_in="server 251f8ae4b (#8267), first in v2.60.0",
        in_25_08=False,
        refuse="already refused by the front",
        reaches_triton_through_front=False),
    GrpcCrash(
        name="unary_infer_cancelled_in_flight",
        method="/inference.GRPCInferenceService/ModelInfer",
        requests=lambda: [_risk_pipeline_request(PAYLOAD_RECORD)],
        metadata=(),
        why="a deadline that expires while the request is in flight (0.5-3 ms, four callers beside four valid "
            "ones, for up to 20 s) races the completion queue",
        seen="SIGSEGV on Triton's own gRPC port within 20 s; our front answers ModelInfer through the C API, so "
             "the public port never reaches this handler",
        returncode=SIGSEGV,
        fixed_in="server f5e4f6909 (#7840, v2.54.0), 42811e0cd (#8078, v2.57.0), 27cece93a (#8220, v2.59.0)",
        in_25_08=False,
        refuse="not reachable through the front",
        reaches_triton_through_front=False,
        extra={"client_timeouts_s": (0.0005, 0.001, 0.002, 0.003), "valid_callers": 4, "seconds": 20}),
]


def http_request_bytes(crash: HttpCrash, host: str) -> bytes:
    body = crash.payload()
    lines = [f"{crash.method} {crash.path} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in crash.headers]
    if crash.chunks:
        lines.append("Transfer-Encoding: chunked")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        size = max(1, len(body) // crash.chunks)
        pieces = [body[i:i + size] for i in range(0, len(body), size)]
        return head + b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def send_http(crash: HttpCrash, host: str, port: int, timeout: float = 30.0) -> bytes:
    """The request sent on a connection of its own; whatever came back before the peer closed or `timeout` passed
    (b"" when the server died without answering)."""
    data = http_request_bytes(crash, f"{host}:{port}")
    answer = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(data)
            while chunk := conn.recv(65536):
                answer += chunk
    except (ConnectionError, socket.timeout):
        pass
    return answer
