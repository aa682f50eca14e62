"""The HTTP front inside tritonserver's process (native/http_front.cc built as libs2t_http_front.so, started by the
preloaded hook), as `s2t serve` runs it: every answer it gives to a valid inference request is the one Triton's own
HTTP front end gives (its loopback port), byte for byte; every refusal of Triton's is Triton's status and words; what
cannot be valid is refused 400 by the front, naming the field; and a request that kills Triton 2.51 (the
classification of a BYTES output) is refused while valid callers keep getting their answers from the same server."""
from __future__ import annotations

import gzip
import json
import socket
import struct
import threading
import time
import zlib

import numpy as np
import pytest
import requests

from s2t.backends.runtime import fault_points
from s2t.serve import http_front
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.serve.triton_crash_requests import HTTP_CRASHES, send_http
from tests.integration.servers import serving, triton_server

# requests asks for compressed answers by default; a compressed answer is Triton's to write (the front relays it).
PLAIN = {"Accept-Encoding": "identity"}


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("http_front") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[str]:
    return [json.dumps({"request_id": f"r-{i}", "features": r})
            for i, r in enumerate(german_credit_data.records()[:64])]


def post(port: int, path: str, body: bytes | str | dict, headers: dict | None = None) -> tuple:
    """(status, Content-Type, Inference-Header-Content-Length, body) of one POST."""
    data = json.dumps(body) if isinstance(body, dict) else body
    answer = requests.post(f"http://127.0.0.1:{port}{path}", data=data, headers={**PLAIN, **(headers or {})},
                           timeout=30)
    return (answer.status_code, answer.headers.get("Content-Type"),
            answer.headers.get("Inference-Header-Content-Length"), answer.content)


def payload(items: list[str], **fields) -> dict:
    return {**fields, "inputs": [{"name": "payload", "datatype": "BYTES", "shape": [len(items), 1], "data": items}]}


def binary_payload(items: list[str], outputs: list[dict] | None = None, **parameters) -> tuple[bytes, dict]:
    """A body with its tensor as binary data after the JSON (the binary-data extension), and its header."""
    raw = b"".join(struct.pack("<I", len(i.encode())) + i.encode() for i in items)
    head = {"inputs": [{"name": "payload", "datatype": "BYTES", "shape": [len(items), 1],
                        "parameters": {"binary_data_size": len(raw)}}]}
    if outputs is not None:
        head["outputs"] = outputs
    if parameters:
        head["parameters"] = parameters
    header = json.dumps(head).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def scorer_body(rows: int) -> dict:
    rng = np.random.default_rng(7)
    return {"id": "scorer", "inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": [rows, 13],
         "data": rng.integers(0, 3, (rows, 13)).tolist()},
        {"name": "numeric", "datatype": "FP32", "shape": [rows, 7], "data": rng.normal(size=(rows, 7)).tolist()}]}


def valid_requests(records: list[str]) -> dict[str, tuple[str, bytes | dict, dict]]:
    pipeline = "/v2/models/risk_pipeline/infer"
    binary_in, binary_header = binary_payload(records[:3])
    binary_both, both_header = binary_payload(records[3:5], binary_data_output=True)
    binary_one, one_header = binary_payload(records[5:6], outputs=[{"name": "decision"}, {
        "name": "probability", "parameters": {"binary_data": True}}])
    return {
        "one record": (pipeline, payload(records[:1]), {}),
        "eight records with an id": (pipeline, payload(records[:8], id="batch-of-8"), {}),
        "a version": ("/v2/models/risk_pipeline/versions/1/infer", payload(records[8:9], id="v1"), {}),
        "one output": (pipeline, {**payload(records[9:10]), "outputs": [{"name": "decision"}]}, {}),
        "a binary output": (pipeline, {**payload(records[10:12]), "outputs": [
            {"name": "probability", "parameters": {"binary_data": True}}, {"name": "decision"}]}, {}),
        "every output binary": (pipeline, payload(records[12:13], parameters={"binary_data_output": True}), {}),
        "binary data in": (pipeline, binary_in, binary_header),
        "binary data in and out": (pipeline, binary_both, both_header),
        "binary in, one output binary": (pipeline, binary_one, one_header),
        "a priority and a timeout": (pipeline, payload(records[13:14], parameters={"priority": 0,
                                                                                   "timeout": 10_000_000}), {}),
        "packed tensors (risk_scorer)": ("/v2/models/risk_scorer/infer", scorer_body(5), {}),
        "risk_router": ("/v2/models/risk_router/infer", payload(records[14:16], id="router"), {}),
        "risk_router with a route": ("/v2/models/risk_router/infer",
                                     payload(records[16:17], parameters={"route": "primary"}), {}),
        "an ensemble": ("/v2/models/risk_pipeline_ensemble/infer", payload(records[17:18], id="ensemble"), {}),
    }


def triton_refusals(records: list[str]) -> dict[str, tuple[str, bytes | dict, dict]]:
    """Refusals of Triton's own that are 4xx (what Triton answers 500 or 501, a body that is not JSON, wrong types, a
    decoupled model, the front refuses itself: test_http_front_refusals.py)."""
    pipeline = "/v2/models/risk_pipeline/infer"
    torn, torn_header = binary_payload(records[:1])
    torn = torn[:-5]
    return {
        "an unknown model": ("/v2/models/no_such_model/infer", payload(records[:1]), {}),
        "an unknown version": ("/v2/models/risk_pipeline/versions/7/infer", payload(records[:1]), {}),
        "a version that is no number": ("/v2/models/risk_pipeline/versions/latest/infer", payload(records[:1]), {}),
        "a wrong input name": (pipeline, {"inputs": [{"name": "record", "datatype": "BYTES", "shape": [1, 1],
                                                      "data": records[:1]}]}, {}),
        "a wrong datatype": (pipeline, {"inputs": [{"name": "payload", "datatype": "FP32", "shape": [1, 1],
                                                    "data": [1.0]}]}, {}),
        "binary data cut short": (pipeline, torn, torn_header),
        "a record the model refuses": (pipeline, payload(['{"request_id": "x", "features": {}}']), {}),
        "a reserved parameter": (pipeline, payload(records[:1], parameters={"triton_x": 1}), {}),
        "a route the router refuses": ("/v2/models/risk_router/infer",
                                       payload(records[:1], parameters={"route": "nowhere"}), {}),
        "a header length past the body": (pipeline, json.dumps(payload(records[:1])),
                                          {"Inference-Header-Content-Length": "999999"}),
    }


def front_refusals(records: list[str]) -> dict[str, tuple[dict, str]]:
    """A body for risk_pipeline the front refuses 400, and the start of its message (the field)."""
    one = payload(records[:1])["inputs"]
    return {
        "classification of a BYTES output": (
            {"inputs": one, "outputs": [{"name": "decision", "parameters": {"classification": 3}}]},
            "outputs[0].parameters.classification: output 'decision' of model 'risk_pipeline' is BYTES"),
        "classification of an unknown output": (
            {"inputs": one, "outputs": [{"name": "nope", "parameters": {"classification": 3}}]},
            "outputs[0].name: model 'risk_pipeline' has no output 'nope'"),
        "classification beside shared memory": (
            {"inputs": one, "outputs": [{"name": "decision", "parameters": {
                "classification": 3, "shared_memory_region": "r"}}]},
            "outputs[0].parameters.classification: output 'decision'"),
        "an unknown output": ({"inputs": one, "outputs": [{"name": "nope"}]},
                              "outputs[0].name: model 'risk_pipeline' has no output 'nope'"),
        "more outputs than the model has": (
            {"inputs": one, "outputs": [{"name": "decision"}, {"name": "probability"}, {"name": "decision"}]},
            "outputs: 3 requested, and model 'risk_pipeline' has 2"),
        "more inputs than the model has": ({"inputs": one * 2}, "inputs: 2 given, and model 'risk_pipeline' has 1"),
        "a negative dimension": ({"inputs": [{**one[0], "shape": [-1, 1]}]},
                                 "inputs[0].shape: every dimension must be a whole number from 0"),
        "a dimension that is no number": ({"inputs": [{**one[0], "shape": [1, "a"]}]},
                                          "inputs[0].shape: every dimension must be a whole number from 0"),
        "an absurd rank": ({"inputs": [{**one[0], "shape": [1] * 40}]}, "inputs[0].shape: 40 dimensions, more than"),
        "a rank the configuration does not take": ({"inputs": [{**one[0], "shape": [1, 1, 1]}]},
                                                   "inputs[0].shape: 3 dimensions, and input 'payload'"),
        "a dimension the configuration does not take": ({"inputs": [{**one[0], "shape": [1, 2]}]},
                                                        "inputs[0].shape: dimension 1 is 2"),
        "a batch over max_batch_size": ({"inputs": [{**one[0], "shape": [1000, 1]}]},
                                        "inputs[0].shape: a batch of 1000, more than model 'risk_pipeline' takes"),
        "an unknown parameter": ({"inputs": one, "parameters": {"colour": "red"}},
                                 "parameters.colour: not a parameter of the protocol"),
        "a shape its data does not fill": ({"inputs": [{**one[0], "shape": [2, 1]}]},
                                           "inputs[0].data: 1 values, and its shape holds 2"),
        "a shape past memory": ({"inputs": [{**one[0], "shape": [1 << 40, 1]}]},
                                "inputs[0].shape: a batch of 1099511627776, more than model 'risk_pipeline'"),
    }


def test_every_answer_is_the_one_tritons_own_front_end_gives(server, records):
    for name, (path, body, headers) in valid_requests(records).items():
        ours, triton = post(server.http_port, path, body, headers), post(server.triton_http_port, path, body, headers)
        assert ours[0] == 200, (name, ours)
        assert ours == triton, name


def test_every_refusal_of_tritons_is_its_status_and_words(server, records):
    for name, (path, body, headers) in triton_refusals(records).items():
        ours, triton = post(server.http_port, path, body, headers), post(server.triton_http_port, path, body, headers)
        assert ours[0] >= 400, (name, ours)
        assert ours == triton, name


@pytest.mark.parametrize("case", list(front_refusals([""]).keys()))
def test_what_cannot_be_valid_is_refused_400_naming_the_field(server, records, case):
    body, message = front_refusals(records)[case]
    status, content_type, _, answer = post(server.http_port, "/v2/models/risk_pipeline/infer", body)
    assert (status, content_type) == (400, "application/json"), answer
    assert json.loads(answer)["error"].startswith(message), answer


def test_classification_of_a_numeric_output_is_tritons_answer(server, records):
    body = {**payload(records[:2]), "outputs": [{"name": "probability", "parameters": {"classification": 1}}]}
    ours = post(server.http_port, "/v2/models/risk_pipeline/infer", body)
    assert ours[0] == 200 and ours == post(server.triton_http_port, "/v2/models/risk_pipeline/infer", body)


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/risk_pipeline",
                                  "/v2/models/risk_pipeline/versions/1", "/v2/models/risk_pipeline/config",
                                  "/v2/models/risk_pipeline/ready", "/v2/models/no_such_model", "/no/such/route",
                                  "/v2/logging", "/v2/repository/index"])
def test_every_other_route_is_relayed_to_triton(server, path):
    ours = requests.get(f"http://127.0.0.1:{server.http_port}{path}", headers=PLAIN, timeout=30)
    triton = requests.get(f"http://127.0.0.1:{server.triton_http_port}{path}", headers=PLAIN, timeout=30)
    assert (ours.status_code, ours.headers.get("Content-Type"), ours.content) == \
        (triton.status_code, triton.headers.get("Content-Type"), triton.content)


def test_a_compressed_answer_is_tritons(server, records):
    body = payload(records[:1])
    ours = requests.post(f"http://127.0.0.1:{server.http_port}/v2/models/risk_pipeline/infer", json=body,
                         headers={"Accept-Encoding": "gzip"}, timeout=30)
    assert ours.status_code == 200 and ours.headers.get("Content-Encoding") == "gzip"
    assert json.loads(ours.content)["outputs"][1]["data"] == json.loads(
        post(server.triton_http_port, "/v2/models/risk_pipeline/infer", body)[3])["outputs"][1]["data"]


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server, records):
    bodies = [json.dumps(payload([records[i]], id=str(i))).encode() for i in range(6)]
    wire = b"".join(b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(b), b) for b in bodies)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(wire)
        received = b""
        while received.count(b'"model_name"') < len(bodies):
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    ids = [received.split(b'{"id":"', 1)[1].split(b'"', 1)[0] for received in received.split(b"HTTP/1.1 200")[1:]]
    assert ids == [str(i).encode() for i in range(6)]


def test_a_body_over_the_limit_and_a_head_over_the_limit_are_refused(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 40_000 + b"\r\n\r\n")
        answer = sock.recv(4096)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer
    assert requests.get(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=10).status_code == 200


def test_classification_of_bytes_beside_valid_traffic_is_refused_and_the_valid_answered_right(server, records):
    """Four valid callers and two asking for the classification of the BYTES output, for a few seconds: every valid
    answer is the one a quiet server gave, every hostile request is refused 400, the server is the same one."""
    path = "/v2/models/risk_pipeline/infer"
    expected = {i: post(server.http_port, path, payload([records[i]], id=str(i))) for i in range(16)}
    hostile_body = {**payload(records[:1]), "outputs": [{"name": "decision", "parameters": {"classification": 2}}]}
    pid, stop = server.process.pid, time.monotonic() + 6
    wrong, counts, lock = [], {"valid": 0, "refused": 0}, threading.Lock()

    def valid(seed: int):
        with requests.Session() as session:
            i = seed
            while time.monotonic() < stop:
                i = (i + 1) % 16
                answer = session.post(f"http://127.0.0.1:{server.http_port}{path}", headers=PLAIN, timeout=30,
                                      data=json.dumps(payload([records[i]], id=str(i))))
                got = (answer.status_code, answer.headers.get("Content-Type"),
                       answer.headers.get("Inference-Header-Content-Length"), answer.content)
                with lock:
                    counts["valid"] += 1
                    if got != expected[i]:
                        wrong.append(("valid", i, got))

    def hostile():
        with requests.Session() as session:
            while time.monotonic() < stop:
                answer = session.post(f"http://127.0.0.1:{server.http_port}{path}", json=hostile_body, timeout=30)
                with lock:
                    counts["refused"] += 1
                    if answer.status_code != 400 or "classification" not in answer.json()["error"]:
                        wrong.append(("hostile", answer.status_code, answer.text))

    threads = [threading.Thread(target=valid, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=hostile) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert counts["valid"] > 100 and counts["refused"] > 50, counts
    assert server.process.poll() is None and server.process.pid == pid


def test_the_front_lives_in_tritonserver(server):
    maps = open(f"/proc/{server.process.pid}/maps").read()
    assert "libs2t_http_front.so" in maps


def nested(depth: int) -> bytes:
    head = b'{"inputs":[{"name":"payload","datatype":"BYTES","shape":[1,1],"data":'
    return head + b"[" * depth + b"]" * depth + b"}]}"


@pytest.mark.parametrize("path", ["/v2/models/risk_pipeline/infer", "/v2/models/risk_pipeline/generate",
                                  "/v2/repository/models/risk_pipeline/load", "/v2/trace/setting"])
def test_json_nested_a_million_deep_is_refused_on_every_route(server, path):
    status, _, _, answer = post(server.http_port, path, b"[" * 1_000_000 + b"]" * 1_000_000)
    assert status == 400 and b"body: JSON nested more than 64 levels deep" in answer, answer
    status, _, _, answer = post(server.http_port, path, nested(1_000_000))
    assert status == 400 and b"nested more than" in answer, answer
    assert server.process.poll() is None


def test_a_compressed_body_is_answered_as_triton_answers_it(server, records):
    body = gzip.compress(json.dumps(payload(records[:2], id="zipped")).encode())
    for encoding, data in (("gzip", body), ("deflate", zlib.compress(json.dumps(payload(records[:1])).encode()))):
        headers = {"Content-Encoding": encoding}
        ours = post(server.http_port, "/v2/models/risk_pipeline/infer", data, headers)
        assert ours[0] == 200, ours
        assert ours == post(server.triton_http_port, "/v2/models/risk_pipeline/infer", data, headers)


def test_a_body_that_is_not_the_stream_it_says_is_refused(server, records):
    data = gzip.compress(json.dumps(payload(records[:1])).encode())[:-12]
    status, _, _, answer = post(server.http_port, "/v2/models/risk_pipeline/infer", data, {"Content-Encoding": "gzip"})
    assert status == 400 and b"body: not a whole gzip stream" in answer, answer


@pytest.mark.parametrize("weight", ["1e999", "2", "0.0001", "1.5", "-1", "x"])
def test_an_accept_encoding_weight_out_of_range_is_refused(server, records, weight):
    for path in ("/v2/models/risk_pipeline/infer", "/v2/models/risk_pipeline/generate", "/v2/health/ready"):
        status, _, _, answer = post(server.http_port, path, payload(records[:1]),
                                    {"Accept-Encoding": f"gzip;q={weight}"})
        assert status == 400 and answer.startswith(b'{"error":"Accept-Encoding: a weight'), answer
    assert post(server.http_port, "/v2/models/risk_pipeline/infer", payload(records[:1]),
                {"Accept-Encoding": "gzip;q=0.5, identity;q=1"})[0] == 200


@pytest.mark.parametrize("crash", [c.name for c in HTTP_CRASHES])
def test_no_request_known_to_kill_triton_reaches_it(server, crash):
    request = next(c for c in HTTP_CRASHES if c.name == crash)
    pid = server.process.pid
    answer = send_http(request, "127.0.0.1", server.http_port, timeout=120)
    # Refused, or read whole and answered (a valid body sent in a million chunks; a body that inflates to no JSON,
    # which Triton refuses in its own words).
    assert answer.startswith(b"HTTP/1.1 "), answer[:300]
    assert server.process.poll() is None and server.process.pid == pid
    assert requests.get(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=10).status_code == 200


def test_a_body_that_inflates_past_the_limit_is_refused(server):
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    data = b"".join(bomb.compress(bytes(16 << 20)) for _ in range(8)) + bomb.flush()  # 128 MiB of zeros
    status, _, _, answer = post(server.http_port, "/v2/models/risk_pipeline/infer", data, {"Content-Encoding": "gzip"})
    assert status == 413 and b"once inflated" in answer, answer
    assert server.process.poll() is None


@pytest.fixture(scope="module")
def tight_server(built_artifacts, tmp_path_factory):
    """A server whose front closes a connection idle for 2 s or whose request has not arrived 4 s after its first
    byte, and holds at most 6 connections per peer; its skill_adapter never answers (it hangs)."""
    log = tmp_path_factory.mktemp("http_front_tight") / "tritonserver.log"
    patch = pytest.MonkeyPatch()
    patch.setattr(http_front, "DEFAULT_IDLE_SECONDS", 2)
    patch.setattr(http_front, "DEFAULT_REQUEST_SECONDS", 4)
    patch.setenv(fault_points.ENVIRONMENT_VARIABLE, "skill_adapter.execute=hang")
    patch.setattr(http_front, "DEFAULT_MAX_CONNECTIONS_PER_PEER", 6)
    try:
        with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
            yield running
    finally:
        patch.undo()


READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_head_or_body_that_never_completes_is_timed_out(tight_server):
    for partial in (b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Le",
                    b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in"):
        with socket.create_connection(("127.0.0.1", tight_server.http_port), timeout=10) as sock:
            sock.sendall(partial)
            started = time.monotonic()
            assert sock.recv(4096) == b""  # closed after the idle time (2 s here), unanswered
            assert time.monotonic() - started < 6


def test_a_head_that_trickles_in_is_cut_at_the_request_deadline(tight_server):
    head = b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: a\r\n" * 100
    with socket.create_connection(("127.0.0.1", tight_server.http_port), timeout=10) as sock:
        started, closed = time.monotonic(), False
        for i in range(len(head)):
            try:
                sock.sendall(head[i:i + 1])
            except OSError:
                closed = True
                break
            time.sleep(0.25)  # one byte each quarter second: never idle for 2 s
            if time.monotonic() - started > 8:
                break
        if not closed:
            sock.settimeout(2)
            try:
                closed = sock.recv(4096) == b""
            except ConnectionResetError:
                closed = True
        assert closed and time.monotonic() - started < 8
    admitted(tight_server.http_port).close()


def test_connections_over_the_limit_are_refused_before_their_first_request(tight_server):
    port = tight_server.http_port
    time.sleep(0.5)  # the connections earlier tests closed are given back by now
    silent = []
    deadline = time.monotonic() + 5
    while len(silent) < 6 and time.monotonic() < deadline:  # connections that send nothing still count
        silent.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", port), timeout=10)
    answer = extra.recv(4096)
    assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer, answer
    for sock in [extra, *silent]:
        sock.close()
    admitted(port).close()


def admitted(port: int) -> socket.socket:
    """A connection the front answered (the server closes those just closed by this test a moment later)."""
    deadline = time.monotonic() + 5
    while True:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(READY)
        answer = sock.recv(4096)
        if answer.startswith(b"HTTP/1.1 200"):
            return sock
        sock.close()
        assert answer.startswith(b"HTTP/1.1 503") and time.monotonic() < deadline, answer
        time.sleep(0.1)


def test_connections_per_peer_are_bounded_and_given_back_when_closed(tight_server):
    port = tight_server.http_port
    for _ in range(5):  # opened, used, closed in every way a client does: the count comes back down each time
        held = [admitted(port) for _ in range(6)]
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        extra.sendall(READY)
        answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer, answer
        extra.close()
        held[0].sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        held[0].recv(4096)
        held[1].shutdown(socket.SHUT_WR)
        held[2].sendall(b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{")
        for sock in held:
            sock.close()
    # An idle connection is closed after its idle time and given back too.
    idle = [admitted(port) for _ in range(6)]
    time.sleep(3)
    assert all(sock.recv(4096) == b"" for sock in idle)
    admitted(port).close()


def test_a_request_triton_works_on_longer_than_the_idle_time_keeps_its_connection(tight_server, records):
    """Last of the module: the hung request's connection counts against its peer until Triton answers (never)."""
    body = json.dumps(payload(records[:1])).encode()
    with socket.create_connection(("127.0.0.1", tight_server.http_port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/skill_adapter/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        sock.settimeout(5)  # more than twice the idle time
        with pytest.raises(socket.timeout):
            sock.recv(4096)  # neither answered (the model hangs) nor closed


def test_where_inference_needs_a_key_triton_checks_it(built_artifacts, records, tmp_path):
    """With --http-restricted-api listing inference, inference is relayed for Triton to check the key."""
    restricted = "--http-restricted-api=inference:infer-key=secret"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], tmp_path / "tritonserver.log",
                               extra_args=[restricted])) as server:
        path, body = "/v2/models/risk_pipeline/infer", payload(records[:1], id="keyed")
        ours, triton = post(server.http_port, path, body), post(server.triton_http_port, path, body)
        assert ours[0] >= 400 and ours == triton
        keyed = {"infer-key": "secret"}
        ours, triton = post(server.http_port, path, body, keyed), post(server.triton_http_port, path, body, keyed)
        assert ours[0] == 200 and ours == triton


def test_without_the_front_triton_listens_on_the_public_port_itself(built_artifacts, records, tmp_path):
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], tmp_path / "tritonserver.log",
                               http_front=False)) as server:
        assert server.triton_http_port is None
        assert "libs2t_http_front.so" not in open(f"/proc/{server.process.pid}/maps").read()
        assert post(server.http_port, "/v2/models/risk_pipeline/infer", payload(records[:1]))[0] == 200
