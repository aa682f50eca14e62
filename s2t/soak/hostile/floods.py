"""Hostile clients for `s2t soak --hostile`, each a real client on loopback, bounded in count and in time.

Every flood returns {"sent": n, "outcomes": {what came back: count}, "unanswered": n}: the outcomes name gRPC
status codes, HTTP statuses or skill statuses as they came, so that the report shows what the server did, fixed or
not. Clients that hold resources (idle streams, idle calls) hold them until `hold_until` (a time.monotonic() value)
and then let go.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from s2t.clients.legacy_record import to_protobuf
from s2t.wire.names import PAYLOAD

# Longest any single flood request is waited for: past it the request counts as unanswered.
REQUEST_TIMEOUT_S = 60.0
# A prompt of about 520 tokens for the small language model: one word is about one token.
LONG_PROMPT = "Describe in detail the credit history of the applicant. " + "risk " * 520
BIG_FEATURE_BYTES = 1 << 20
CLIENT_GAVE_UP = "no answer within the client's deadline"


def _result(sent: int, outcomes: Counter, unanswered: int = 0) -> dict:
    return {"sent": sent, "outcomes": dict(outcomes), "unanswered": unanswered}


def _wait_until(deadline: float, stop: threading.Event | None = None) -> None:
    while (left := deadline - time.monotonic()) > 0 and not (stop and stop.is_set()):
        time.sleep(min(left, 0.2))


def _answers_a_record(error) -> bool:
    """Whether a stream callback's error is a record's own answer (a response carrying its error message, which
    tritonclient raises without a status) rather than the stream's end (raised with the call's status code)."""
    return error.status() is None


def idle_streams(grpc_url: str, records: Sequence[Mapping], count: int, hold_until: float) -> dict:
    """`count` risk_stream sequences on one connection, each started with one record and then left quiet until
    `hold_until`; the first records' answers are counted."""
    import tritonclient.grpc as grpcclient
    outcomes, lock, answered = Counter(), threading.Lock(), [0]

    def callback(result, error):
        with lock:
            # An error that is not a record's answer (the server ending the quiet stream after its idle limit, as it
            # should) is counted as what it is, never as one more answer.
            if error is None or _answers_a_record(error):
                answered[0] += 1
            outcomes["error: " + error.message()[:80] if error is not None else "first record answered"] += 1

    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=callback)
    run = f"soak-idle-{time.monotonic_ns()}"
    try:
        for i in range(count):
            tensor = grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
            payload = json.dumps({"sequence_id": 0, "features": records[i % len(records)]}).encode()
            tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
            client.async_stream_infer("risk_stream", [tensor], sequence_id=f"{run}-{i}", sequence_start=True)
        _wait_until(hold_until)
        with lock:
            # What came before we let go: the cancellations that follow are our own doing.
            held, first_answers = Counter(outcomes), answered[0]
    finally:
        # Cancelling on our side is a client going away, which is what the server must survive.
        client.stop_stream(cancel_requests=True)
        client.close()
    return _result(count, held, count - first_answers)


def _skill_stub(url: str):
    import grpc

    from s2t.wire import skill_pb2_grpc
    channel = grpc.insecure_channel(url, options=[("grpc.max_send_message_length", 8 << 20)])
    return channel, skill_pb2_grpc.SkillStub(channel)


def _call_outcome(call) -> str:
    import grpc
    try:
        result = call.result()
    except grpc.RpcError as err:
        # The client's own deadline reads "Deadline Exceeded"; a server ending the call says why.
        own = err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and err.details() == "Deadline Exceeded"
        return CLIENT_GAVE_UP if own else err.code().name
    from s2t.wire import skill_pb2
    statuses = Counter(skill_pb2.SkillStatus.Name(r.status) for r in result.results)
    return "call OK (records: " + ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) + ")"


def idle_gateway_calls(gateway_url: str, records: Sequence[Mapping], count: int, hold_until: float) -> dict:
    """`count` legacy Score calls that send one record and then nothing until `hold_until` (or until the gateway
    ends them)."""
    channel, stub = _skill_stub(gateway_url)
    release = threading.Event()

    def quiet(k: int):
        yield to_protobuf({"request_id": f"idle-{k}", "features": records[k % len(records)]})
        _wait_until(hold_until, release)

    calls = [stub.Score.future(quiet(k), timeout=max(1.0, hold_until - time.monotonic()) + REQUEST_TIMEOUT_S)
             for k in range(count)]
    try:
        _wait_until(hold_until)
        release.set()
        outcomes = Counter(_call_outcome(call) for call in calls)
    finally:
        release.set()
        for call in calls:
            call.cancel()
        channel.close()
    return _result(count, outcomes, outcomes.get(CLIENT_GAVE_UP, 0))


def big_records(gateway_url: str, records: Sequence[Mapping], callers: int, per_call: int, deadline: float) -> dict:
    """`callers` Score calls at once, each streaming `per_call` records that carry a 1 MiB string in one feature:
    each record should come back INVALID_RECORD (or the call be refused), and memory should not follow."""
    from s2t.wire import skill_pb2
    channel, stub = _skill_stub(gateway_url)
    # A categorical attribute: the record is well-formed but for its size.
    name = next(key for key, value in records[0].items() if isinstance(value, str))

    def stream(k: int):
        for i in range(per_call):
            if time.monotonic() > deadline:
                return
            record = to_protobuf({"request_id": f"big-{k}-{i}", "features": records[(k + i) % len(records)]})
            record.features[name].CopyFrom(skill_pb2.FeatureValue(string_value="x" * BIG_FEATURE_BYTES))
            yield record

    try:
        calls = [stub.Score.future(stream(k), timeout=REQUEST_TIMEOUT_S) for k in range(callers)]
        outcomes = Counter()
        for call in calls:
            outcomes[_call_outcome(call)] += 1
    finally:
        channel.close()
    return _result(callers, outcomes, outcomes.get(CLIENT_GAVE_UP, 0))


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.rsplit(":", 1)
    return host, int(port)


def llm_disconnects(http_url: str, count: int, deadline: float, concurrency: int = 16,
                    after_s: float = 0.1) -> dict:
    """`count` generate_stream requests for a long prompt and 512 tokens, each client gone `after_s` after sending:
    what the server does with the abandoned work shows up in the valid llm path's latency."""
    body = json.dumps({"text_input": LONG_PROMPT, "max_tokens": 512}).encode()

    def one(_k: int) -> str:
        if time.monotonic() > deadline:
            return "not sent (flood time over)"
        try:
            with socket.create_connection(_host_port(http_url), timeout=5) as sock:
                sock.sendall(b"POST /v2/models/llm/generate_stream HTTP/1.1\r\nHost: soak\r\n"
                             b"Content-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                time.sleep(after_s)
        except OSError as err:
            return f"connect failed: {type(err).__name__}"
        return "disconnected"

    with ThreadPoolExecutor(concurrency) as pool:
        outcomes = Counter(pool.map(one, range(count)))
    return _result(count, outcomes)


LOAD_REFUSAL = "StatusCode.UNAVAILABLE (the caller's share of the gRPC front's calls: try again)"


def bogus_routes(grpc_url: str, records: Sequence[Mapping], count: int, deadline: float,
                 concurrency: int = 8) -> tuple[dict, list[str]]:
    """`count` risk_router requests, each forcing `route` to a different version that does not exist. Returns the
    flood's result and the routes sent (to look for them in the metrics page)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    routes = [f"soak-bogus-{time.monotonic_ns() % 10**9}-{k}" for k in range(count)]
    local, clients, lock = threading.local(), [], threading.Lock()

    def one(k: int) -> str:
        if time.monotonic() > deadline:
            return "not sent (flood time over)"
        if not hasattr(local, "client"):
            local.client = grpcclient.InferenceServerClient(grpc_url)
            with lock:
                clients.append(local.client)
        tensor = grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
        payload = json.dumps({"features": records[k % len(records)]}).encode()
        tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
        try:
            local.client.infer("risk_router", [tensor], parameters={"route": routes[k]},
                               client_timeout=REQUEST_TIMEOUT_S)
        except InferenceServerException as err:
            # The gRPC front refusing a call for its caller's share of the calls in flight says so (retryable):
            # told apart from any other UNAVAILABLE, which would be the server's.
            if err.status() == "StatusCode.UNAVAILABLE" and "try again" in (err.message() or ""):
                return LOAD_REFUSAL
            return str(err.status())
        return "scored"

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            outcomes = Counter(pool.map(one, range(count)))
    finally:
        for client in clients:
            client.close()
    return _result(count, outcomes, outcomes.get("StatusCode.DEADLINE_EXCEEDED", 0)), routes


def oversized_bodies(http_url: str, count: int, size_bytes: int, deadline: float) -> dict:
    """`count` HTTP infer requests on risk_pipeline whose body is `size_bytes` of JSON padding, sent one after
    another: each should be refused (413 or 400) without the server keeping the bytes. The result's "answers" holds
    the first body of each status that came back."""
    chunk = b" " * (1 << 20)
    outcomes, unanswered, said = Counter(), 0, {}
    for _ in range(count):
        if time.monotonic() > deadline:
            outcomes["not sent (flood time over)"] += 1
            continue
        connection = http.client.HTTPConnection(*_host_port(http_url), timeout=REQUEST_TIMEOUT_S)
        try:
            connection.putrequest("POST", "/v2/models/risk_pipeline/infer")
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(size_bytes))
            connection.endheaders()
            left = size_bytes
            try:
                while left > 0:
                    connection.send(chunk[:min(left, len(chunk))])
                    left -= min(left, len(chunk))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused while sending: the status may still be readable
            response = connection.getresponse()
            # What the server said, once per status: the report shows the words of a refusal (or of a failure).
            said.setdefault(f"HTTP {response.status}", response.read()[:200].decode(errors="replace"))
            outcomes[f"HTTP {response.status}"] += 1
        except (OSError, http.client.HTTPException) as err:
            outcomes[f"no answer: {type(err).__name__}"] += 1
            unanswered += 1
        finally:
            connection.close()
    return {**_result(count, outcomes, unanswered), "answers": said}


def _http_status(http_url: str, method: str, path: str, body: dict | None = None) -> tuple[int | None, str]:
    connection = http.client.HTTPConnection(*_host_port(http_url), timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request(method, path, json.dumps(body) if body is not None else None,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()[:300].decode(errors="replace")
    except (OSError, http.client.HTTPException) as err:
        return None, type(err).__name__
    finally:
        connection.close()


def _grpc_refused(call: Callable[[], object]) -> tuple[bool, str]:
    from tritonclient.utils import InferenceServerException
    try:
        call()
    except InferenceServerException as err:
        message = err.message() or ""
        # A restricted protocol answers UNAVAILABLE "This protocol is restricted ..."; any other error means the
        # request reached the API (a register attempt that failed to open the region, say).
        return "restricted" in message.lower(), f"{err.status()} {message[:120]}"
    return False, "OK"


def api_probes(http_url: str, grpc_url: str) -> list[dict]:
    """The admin APIs tried without the admin key over HTTP and gRPC: shared-memory registration (of a region that
    does not exist, so nothing is mapped), and reading the log and trace settings (nothing is changed).
    `refused` is True only when the server refused the call for want of the key."""
    import tritonclient.grpc as grpcclient
    region, key = "soak_probe", "/soak_probe_missing"
    probes = []
    for method, path, body in (("POST", f"/v2/systemsharedmemory/region/{region}/register",
                                {"key": key, "offset": 0, "byte_size": 64}),
                               ("GET", "/v2/logging", None), ("GET", "/v2/trace/setting", None)):
        status, text = _http_status(http_url, method, path, body)
        probes.append({"probe": f"HTTP {method} {path}", "status": status, "detail": text[:160],
                       "refused": status == 403, "unanswered": status is None})
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        for name, call in (("gRPC SystemSharedMemoryRegister",
                            lambda: client.register_system_shared_memory(region, key, 64, client_timeout=30)),
                           ("gRPC LogSettings", lambda: client.get_log_settings(client_timeout=30)),
                           ("gRPC TraceSetting", lambda: client.get_trace_settings(client_timeout=30))):
            refused, detail = _grpc_refused(call)
            probes.append({"probe": name, "status": detail.split(" ")[0], "detail": detail, "refused": refused,
                           "unanswered": "DEADLINE_EXCEEDED" in detail})
    finally:
        client.close()
    return probes
