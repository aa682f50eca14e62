"""Callers that get it wrong, for `s2t soak --hostile`, each a real client on loopback, bounded in count and by the
end of `during`: invalid records and malformed BYTES buffers sent to risk_pipeline beside valid requests, gRPC
callers whose deadline expires while the server works, and risk_stream streams cancelled or dropped mid-stream.

Each returns {"sent": n, "outcomes": {what came back: count}, "unanswered": n}, as the other floods do; the caller
error floods add how many of their invalid and valid requests were answered as they must be (bad_requests.count).
A caller that gives up on purpose is not an unanswered request: what the server does about it shows in the valid
paths, the process pids and the supervisor's counters.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from s2t.backends.runtime import bytes_tensor
from s2t.soak.hostile import bad_requests
from s2t.soak.hostile.bad_requests import MALFORMED_BYTES, VALID, Answer
from s2t.soak.hostile.floods import REQUEST_TIMEOUT_S
from s2t.soak.hostile.valid_paths import host_port
from s2t.wire.names import PAYLOAD

NOT_SENT = "not sent (flood time over)"
# The deadlines of callers that give up: shorter than risk_pipeline's work, so they expire while Triton works on
# the request (the range that took Triton 2.51's own gRPC front end down).
GIVE_UP_S = (0.0002, 0.003)
RECORDS_PER_CANCELLED_STREAM = 3
# A cancelled stream waits this long for its first answer before it is cancelled anyway.
FIRST_ANSWER_WAIT_S = 5.0


class _GrpcClients:
    """One tritonclient gRPC client per thread, all closed at the end."""

    def __init__(self, grpc_url: str):
        import tritonclient.grpc as grpcclient
        self.module, self.url = grpcclient, grpc_url
        self._local, self._all, self._lock = threading.local(), [], threading.Lock()

    def get(self):
        if not hasattr(self._local, "client"):
            self._local.client = self.module.InferenceServerClient(self.url)
            with self._lock:
                self._all.append(self._local.client)
        return self._local.client

    def payload_tensor(self, payload: bytes):
        tensor = self.module.InferInput(PAYLOAD, [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
        return tensor

    def close(self) -> None:
        for client in self._all:
            client.close()


def _grpc_infer(clients: _GrpcClients, payload: bytes, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[str, str]:
    from tritonclient.utils import InferenceServerException
    try:
        clients.get().infer("risk_pipeline", [clients.payload_tensor(payload)], client_timeout=timeout_s)
    except InferenceServerException as err:
        return str(err.status()).removeprefix("StatusCode."), err.message() or ""
    return "OK", ""


def _http_post(http_url: str, body: bytes, headers: Mapping[str, str]) -> tuple[str | None, str]:
    """(HTTP status, the error message) of one risk_pipeline infer request; (None, why) when nothing came back."""
    connection = http.client.HTTPConnection(*host_port(http_url), timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request("POST", "/v2/models/risk_pipeline/infer", body, dict(headers))
        response = connection.getresponse()
        text = response.read()
    except (OSError, http.client.HTTPException) as err:
        return None, f"{type(err).__name__}: {err}"
    finally:
        connection.close()
    if response.status == 200:
        return "HTTP 200", ""
    try:
        message = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        message = text[:200].decode(errors="replace")
    return f"HTTP {response.status}", str(message)


def _http_json(http_url: str, payload: bytes) -> tuple[str | None, str]:
    body = json.dumps({"inputs": [{"name": PAYLOAD, "shape": [1, 1], "datatype": "BYTES",
                                   "data": [payload.decode()]}]}).encode()
    return _http_post(http_url, body, {"Content-Type": "application/json"})


def _flood(count: int, callers: int, deadline: float, one: Callable[[int], Answer | None]) -> dict:
    """`one(k)` for k in 0..count-1 from `callers` threads, none started after `deadline`; counted."""
    def guarded(k: int) -> Answer | None:
        return None if time.monotonic() > deadline else one(k)

    with ThreadPoolExecutor(callers) as pool:
        answers = list(pool.map(guarded, range(count)))
    result = bad_requests.count(a for a in answers if a is not None)
    not_sent = answers.count(None)
    if not_sent:
        result["outcomes"][NOT_SENT] = not_sent
    return result


def invalid_records(http_url: str, grpc_url: str, records: Sequence[Mapping], count: int, callers: int,
                    deadline: float) -> dict:
    """`count` risk_pipeline requests over HTTP JSON and gRPC, one in five carrying a record invalid in one of
    bad_requests.INVALID_KINDS (each kind over both protocols), the rest valid: each invalid one must be refused
    naming its field, each valid one scored."""
    clients = _GrpcClients(grpc_url)
    run = uuid.uuid4().hex[:8]

    def one(k: int) -> Answer:
        kind, protocol = bad_requests.kind_of_request(k), bad_requests.protocol_of(k)
        features = records[k % len(records)]
        if kind is None:
            payload, field = json.dumps({"request_id": f"soak-{run}-{k}", "features": features}).encode(), None
        else:
            bad = bad_requests.bad_record(kind, features, f"soak-{run}-{k}")
            payload, field = bad.payload, bad.field
        status, message = _http_json(http_url, payload) if protocol == "http" else _grpc_infer(clients, payload)
        return Answer(f"{kind or VALID} ({protocol})", field, status, message)

    try:
        return _flood(count, callers, deadline, one)
    finally:
        clients.close()


def malformed_bytes(http_url: str, records: Sequence[Mapping], count: int, callers: int, deadline: float) -> dict:
    """`count` risk_pipeline requests in the HTTP binary-data extension, one in five a BYTES element whose length
    runs past the end of its buffer, the rest well-formed: each malformed one must be refused naming `payload`."""
    def one(k: int) -> Answer:
        record = json.dumps({"request_id": f"soak-bytes-{k}", "features": records[k % len(records)]}).encode()
        malformed = bad_requests.kind_of_request(k) is not None
        raw = bad_requests.overrunning_element(record) if malformed else bytes_tensor.encode([record])
        status, message = _http_post(http_url, *bad_requests.binary_data_request(raw))
        return Answer(MALFORMED_BYTES if malformed else VALID, PAYLOAD if malformed else None, status, message)

    return _flood(count, callers, deadline, one)


def grpc_deadlines(grpc_url: str, records: Sequence[Mapping], count: int, callers: int, deadline: float,
                   rate_per_s: float = 0.0) -> dict:
    """Up to `count` valid risk_pipeline requests over gRPC from `callers` threads, each with a deadline in
    GIVE_UP_S, so that most expire while the server works on them; at most `rate_per_s` a second (0: as fast as they
    go), and none sent, nor waited for, after `deadline`: what was sent by then is what is reported."""
    clients = _GrpcClients(grpc_url)
    started, lock, next_k = time.monotonic(), threading.Lock(), [0]
    outcomes: Counter = Counter()

    def one(k: int) -> str:
        low, high = GIVE_UP_S
        timeout_s = low + (high - low) * ((k * 7919) % 1000) / 1000
        payload = json.dumps({"request_id": f"soak-gives-up-{k}", "features": records[k % len(records)]}).encode()
        status, message = _grpc_infer(clients, payload, timeout_s)
        if status == "OK":
            return "answered within its deadline"
        return "gave up (its deadline expired)" if status == "DEADLINE_EXCEEDED" else f"{status} {message[:80]}"

    def caller() -> None:
        while True:
            with lock:
                k = next_k[0]
                next_k[0] += 1
            if k >= count:
                return
            # The pace never carries a caller past the flood's end: a call due after it is not made.
            due = started + k / rate_per_s if rate_per_s > 0 else started
            if due >= deadline:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            if time.monotonic() >= deadline:
                return
            outcome = one(k)
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=caller, name=f"soak-gives-up-{i}", daemon=True) for i in range(callers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        clients.close()
    with lock:
        sent = sum(outcomes.values())
        return {"sent": sent, "outcomes": dict(outcomes), "unanswered": 0, "planned": count}


def _stream_records(records: Sequence[Mapping], stream: str, k: int) -> list[bytes]:
    return [json.dumps({"request_id": f"{stream}/{i}", "stream_id": stream, "sequence_id": i,
                        "features": records[(k + i) % len(records)]}).encode()
            for i in range(RECORDS_PER_CANCELLED_STREAM)]


def _cancelled_stream(grpc_url: str, records: Sequence[Mapping], stream: str, k: int) -> str:
    """A stream that sends its records and, once the first is answered, is cancelled with stop_stream."""
    import tritonclient.grpc as grpcclient
    first = threading.Event()
    errors: list[str] = []

    def callback(result, error):
        if error is not None and not first.is_set():
            errors.append(error.message()[:80])
        first.set()

    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=callback)
        for i, payload in enumerate(_stream_records(records, stream, k)):
            tensor = grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
            client.async_stream_infer("risk_stream", [tensor], sequence_id=stream, sequence_start=i == 0)
        answered = first.wait(FIRST_ANSWER_WAIT_S)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    if errors:
        return f"error before cancelling: {errors[0]}"
    return "cancelled after its first answer" if answered else "cancelled with no answer yet"


def _dropped_stream(grpc_url: str, records: Sequence[Mapping], stream: str, k: int) -> str:
    """A stream whose connection is closed under it once its first record is answered, its request side still
    open: what a client process that dies looks like to the server."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def request(i: int, payload: bytes):
        message = service_pb2.ModelInferRequest(model_name="risk_stream", id=str(i))
        message.parameters["sequence_id"].string_param = stream
        message.parameters["sequence_start"].bool_param = i == 0
        tensor = message.inputs.add(name=PAYLOAD, datatype="BYTES")
        tensor.shape.extend([1, 1])
        message.raw_input_contents.append(bytes_tensor.encode([payload]))
        return message

    dropped = threading.Event()

    def requests():
        yield from (request(i, p) for i, p in enumerate(_stream_records(records, stream, k)))
        dropped.wait(REQUEST_TIMEOUT_S)

    channel = grpc.insecure_channel(grpc_url)
    # Nothing answered within the wait: the connection is dropped anyway.
    timer = threading.Timer(FIRST_ANSWER_WAIT_S, channel.close)
    timer.start()
    try:
        response = next(service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests()))
        outcome = ("dropped after its first answer" if not response.error_message
                   else f"error before dropping: {response.error_message[:80]}")
    except grpc.RpcError as err:
        outcome = "dropped with no answer yet" if err.code() == grpc.StatusCode.CANCELLED else err.code().name
    except StopIteration:
        outcome = "stream ended with no answer"
    finally:
        timer.cancel()
        channel.close()
        dropped.set()
    return outcome


def cancelled_streams(grpc_url: str, records: Sequence[Mapping], count: int, callers: int, deadline: float) -> dict:
    """`count` risk_stream streams that start a sequence, send a few records and go away mid-stream: every other
    one cancelled (stop_stream(cancel_requests=True)), the others dropped with their connection."""
    run = uuid.uuid4().hex[:8]

    def one(k: int) -> str:
        if time.monotonic() > deadline:
            return NOT_SENT
        stream = f"soak-cancel-{run}-{k}"
        try:
            return (_cancelled_stream if k % 2 == 0 else _dropped_stream)(grpc_url, records, stream, k)
        except Exception as err:  # noqa: BLE001 - a client that broke is this stream's outcome
            return f"client failed: {type(err).__name__}: {str(err)[:80]}"

    with ThreadPoolExecutor(callers) as pool:
        outcomes = Counter(pool.map(one, range(count)))
    return {"sent": count - outcomes.get(NOT_SENT, 0), "outcomes": dict(outcomes), "unanswered": 0}
