"""What the HTTP front inside tritonserver (native/http_front.cc) refuses itself rather than pass to Triton 2.51, whose
own HTTP front end dies of some of it and answers much of the rest 500 or 501: a body that is not JSON (Triton reads
NaN and Infinity, then sizes a tensor from a shape nothing checked: std::bad_alloc), a request of the wrong JSON types,
a content coding Triton does not read, inference of a decoupled model, a model name no model can have; and the
memory that request bodies in flight may hold, raw and inflated, all together. Each refusal is a 4xx naming the field
(503 past the memory budget), for that request alone, beside valid traffic, from the same tritonserver."""
from __future__ import annotations

import gzip
import json
import socket
import threading
import time

import numpy as np
import pytest
import requests

from s2t.serve import http_front
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server
from tests.integration.traffic import PACE_S

PLAIN = {"Accept-Encoding": "identity"}
PIPELINE = "/v2/models/risk_pipeline/infer"
SCORER = "/v2/models/risk_scorer/infer"
BUDGET_REFUSAL = "body: the request bodies in flight hold the memory set aside for them"


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("http_front_refusals") / "tritonserver.log"
    with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
        yield running


@pytest.fixture(scope="module")
def records(german_credit_data) -> list[str]:
    return [json.dumps({"request_id": f"r-{i}", "features": r})
            for i, r in enumerate(german_credit_data.records()[:16])]


def post(port: int, path: str, body: bytes | str | dict, headers: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body) if isinstance(body, dict) else body
    answer = requests.post(f"http://127.0.0.1:{port}{path}", data=data, headers={**PLAIN, **(headers or {})},
                           timeout=60)
    return answer.status_code, answer.content


def payload(items: list[str], **fields) -> dict:
    return {**fields, "inputs": [{"name": "payload", "datatype": "BYTES", "shape": [len(items), 1], "data": items}]}


def with_input(records: list[str], **changes) -> dict:
    """A risk_pipeline request whose one input has `changes` (a value None: the key removed)."""
    tensor = {**payload(records[:1])["inputs"][0], **changes}
    return {"inputs": [{k: v for k, v in tensor.items() if v is not None}]}


def with_output(records: list[str], parameters: dict) -> dict:
    return {**payload(records[:1]), "outputs": [{"name": "probability", "parameters": parameters}]}


# NaN and the infinities are not JSON; Triton's reader takes them, and a shape of 2^33 rows then kills it.
NOT_JSON_BOMBS = [b'{"inputs":[{"name":"x","datatype":"FP32","shape":[8589934592],"data":[%s]}]}' % value
                  for value in (b"NaN", b"Infinity", b"-Infinity")]


@pytest.mark.parametrize("body", NOT_JSON_BOMBS, ids=["NaN", "Infinity", "-Infinity"])
def test_a_body_that_is_not_json_never_reaches_triton(server, body):
    pid = server.process.pid
    for path in (SCORER, "/v2/models/risk_scorer/versions/1/infer", "/v2/models/risk_scorer/generate"):
        status, answer = post(server.http_port, path, body)
        assert status == 400 and json.loads(answer)["error"].startswith("body: not JSON ("), (path, answer)
    assert server.process.poll() is None and server.process.pid == pid


def not_json(records: list[str]) -> dict[str, bytes]:
    valid = json.dumps(payload(records[:1])).encode()
    return {"cut short": valid[:-3], "trailing brace": valid + b"}", "lone surrogate in id":
            valid.replace(b"{", b'{"id": "\\ud800", ', 1), "a number past double": valid.replace(
            b'"shape": [1, 1]', b'"shape": [1e400, 1]'), "a bad escape": valid.replace(b"{", b'{"id": "\\q", ', 1)}


def field_refusals(records: list[str]) -> dict[str, tuple[str, dict, str]]:
    """Requests of the wrong JSON types (Triton answers them 500): path, body, the start of the front's message."""
    one = payload(records[:1])
    return {
        "inputs as an object": (PIPELINE, {"inputs": {}}, "inputs: must be an array"),
        "no inputs": (PIPELINE, {"id": "x"}, "inputs: required"),
        "parameters as a list": (PIPELINE, {**one, "parameters": []}, "parameters: must be an object"),
        "timeout as a string": (PIPELINE, {**one, "parameters": {"timeout": "1"}},
                                "parameters.timeout: must be a whole number from 0"),
        "priority as a word": (PIPELINE, {**one, "parameters": {"priority": "high"}},
                               "parameters.priority: must be a whole number from 0"),
        "sequence_start as a number": (PIPELINE, {**one, "parameters": {"sequence_start": 1}},
                                       "parameters.sequence_start: must be true or false"),
        "binary_data as a word": (PIPELINE, with_output(records, {"binary_data": "yes"}),
                                  "outputs[0].parameters.binary_data: must be true or false"),
        "classification as a string": (PIPELINE, with_output(records, {"classification": "3"}),
                                       "outputs[0].parameters.classification: must be a whole number from 0"),
        "binary_data_size negative": (PIPELINE, with_input(records, data=None, parameters={"binary_data_size": -1}),
                                      "inputs[0].parameters.binary_data_size: must be a whole number from 0"),
        "binary_data_size a string": (PIPELINE, with_input(records, data=None, parameters={"binary_data_size": "8"}),
                                      "inputs[0].parameters.binary_data_size: must be a whole number from 0"),
        "shape not an array": (PIPELINE, with_input(records, shape={}), "inputs[0].shape: must be an array"),
        "data not an array": (PIPELINE, with_input(records, data="x"), "inputs[0].data: must be an array"),
        "BYTES data that are not strings": (PIPELINE, with_input(records, data=[5]),
                                            "inputs[0].data: must hold 1 BYTES strings"),
        "an input without datatype": (PIPELINE, with_input(records, datatype=None),
                                      "inputs[0].datatype: must be a string"),
        "a decoupled model": ("/v2/models/risk_stream/infer", one, "model 'risk_stream' is decoupled"),
    }


def test_bodies_that_are_not_json_and_wrong_types_are_refused_400_naming_why_beside_valid_traffic(server, records):
    """Each refusal is the front's 400 with the field, while four callers keep getting their answers."""
    expected = {i: post(server.http_port, PIPELINE, payload([records[i]], id=str(i))) for i in range(8)}
    cases = [(f"not JSON: {name}", PIPELINE, body, "body: not JSON (") for name, body in not_json(records).items()]
    cases += [(name, path, body, message) for name, (path, body, message) in field_refusals(records).items()]
    pid, stop = server.process.pid, threading.Event()
    wrong, valid_count, lock = [], [0], threading.Lock()

    def valid(seed: int) -> None:
        with requests.Session() as session:
            i = seed
            while not stop.wait(PACE_S):
                i = (i + 1) % 8
                answer = session.post(f"http://127.0.0.1:{server.http_port}{PIPELINE}", headers=PLAIN, timeout=60,
                                      data=json.dumps(payload([records[i]], id=str(i))))
                with lock:
                    valid_count[0] += 1
                    if (answer.status_code, answer.content) != expected[i]:
                        wrong.append(("valid", i, answer.status_code, answer.content[:200]))

    threads = [threading.Thread(target=valid, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(3):
            for name, path, body, message in cases:
                status, answer = post(server.http_port, path, body)
                if status != 400 or not json.loads(answer)["error"].startswith(message):
                    wrong.append((name, status, answer[:300]))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert wrong == []
    assert valid_count[0] > 0
    assert server.process.poll() is None and server.process.pid == pid


def test_a_content_coding_triton_does_not_read_is_415(server, records):
    for encoding in ("br", "zstd", "x"):
        for path in (PIPELINE, "/v2/models/risk_pipeline/generate"):
            status, answer = post(server.http_port, path, payload(records[:1]), {"Content-Encoding": encoding})
            assert status == 415, (encoding, path, answer)
            assert json.loads(answer)["error"].startswith(f"Content-Encoding: '{encoding}' is not a coding"), answer
    assert post(server.http_port, PIPELINE, payload(records[:1]))[0] == 200


def test_a_model_name_no_model_can_have_is_refused_400(server):
    answer = requests.get(f"http://127.0.0.1:{server.http_port}/v2/models/{'m' * 5000}/ready", timeout=30)
    assert answer.status_code == 400 and answer.json()["error"].startswith("model name: 5000 bytes"), answer.text
    assert requests.get(f"http://127.0.0.1:{server.http_port}/v2/models/risk_pipeline/ready",
                        timeout=30).status_code == 200


def test_a_64_mib_body_is_answered_or_refused_400_never_500(server, records):
    """Triton 2.51 has no limit of its own on a body (`--http-max-input-size` came later): a body under the front's
    limit that is JSON is answered, and one that is not is the front's 400 (Triton answered it 500)."""
    padding = b" " * (64 << 20)
    status, answer = post(server.http_port, PIPELINE, padding)
    assert status == 400 and b"body: not JSON (The document is empty." in answer, answer[:300]
    status, answer = post(server.http_port, PIPELINE, json.dumps(payload(records[:1])).encode() + padding)
    assert status == 200, answer[:300]


# ---- the memory bodies in flight may hold

BUDGET = 8 << 20


@pytest.fixture(scope="module")
def budget_server(built_artifacts, tmp_path_factory):
    """A server whose front holds at most 8 MiB of request bodies, raw and inflated, at once."""
    log = tmp_path_factory.mktemp("http_front_budget") / "tritonserver.log"
    patch = pytest.MonkeyPatch()
    patch.setattr(http_front, "DEFAULT_MAX_BODY_MEMORY_BYTES", BUDGET)
    try:
        with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
            yield running
    finally:
        patch.undo()


def inflating_to(records: list[str], size: int) -> bytes:
    """A valid risk_pipeline request, padded with whitespace to `size` bytes, gzipped (a few KiB)."""
    body = json.dumps(payload(records[:1])).encode()
    return gzip.compress(body + b" " * (size - len(body)), mtime=0)


def test_bodies_in_flight_past_the_memory_budget_are_refused_503_at_once(budget_server, records):
    port, pid = budget_server.http_port, budget_server.process.pid
    zipped = {"Content-Encoding": "gzip"}
    status, answer = post(port, PIPELINE, inflating_to(records, BUDGET + (1 << 20)), zipped)
    assert status == 503 and json.loads(answer)["error"].startswith(BUDGET_REFUSAL), answer[:300]
    status, answer = post(port, PIPELINE, b" " * (BUDGET + 1))
    assert status == 503 and json.loads(answer)["error"].startswith(BUDGET_REFUSAL), answer[:300]
    assert post(port, PIPELINE, inflating_to(records, 3 << 20), zipped)[0] == 200

    # Many bodies inflating to 3 MiB at once beside small valid requests: each answered, or refused 503 for the
    # budget; never anything else.
    stop, outcomes, wrong, lock = time.monotonic() + 6, {}, [], threading.Lock()
    big = inflating_to(records, 3 << 20)

    def send(body: bytes, headers: dict) -> None:
        with requests.Session() as session:
            while time.monotonic() < stop:
                answer = session.post(f"http://127.0.0.1:{port}{PIPELINE}", data=body, timeout=60,
                                      headers={**PLAIN, **headers})
                refused = answer.status_code == 503 and answer.json()["error"].startswith(BUDGET_REFUSAL)
                with lock:
                    outcomes[answer.status_code] = outcomes.get(answer.status_code, 0) + 1
                    if answer.status_code != 200 and not refused:
                        wrong.append((answer.status_code, answer.content[:200]))

    threads = [threading.Thread(target=send, args=(big, zipped)) for _ in range(8)]
    threads += [threading.Thread(target=send, args=(json.dumps(payload(records[:1])).encode(), {}))
                for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == [], wrong[:5]
    assert outcomes.get(200, 0) > 0, outcomes
    # Every byte was given back: a body that takes nearly the whole budget alone is answered.
    assert post(port, PIPELINE, inflating_to(records, BUDGET - (1 << 20)), zipped)[0] == 200
    assert budget_server.process.poll() is None and budget_server.process.pid == pid


# ---- requests that went to Triton unchecked, and headers given twice

def huge_numeric(**extra) -> dict:
    """A risk_scorer request whose `numeric` input claims 2^40 rows and holds one value, with `extra` fields."""
    return {"inputs": [{"name": "numeric", "datatype": "FP32", "shape": [1 << 40, 7], "data": [0.0]},
                       *extra.pop("inputs", [])], **extra}


SHAPE_PAST_DATA = {
    "an output in shared memory": huge_numeric(outputs=[{"name": "probability", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4}}]),
    "a second input in shared memory": huge_numeric(inputs=[{"name": "categorical", "datatype": "INT64",
                                                             "shape": [1, 13], "parameters": {
                                                                 "shared_memory_region": "r",
                                                                 "shared_memory_byte_size": 104}}]),
}


@pytest.mark.parametrize("case", list(SHAPE_PAST_DATA))
def test_data_short_of_its_shape_is_refused_even_where_triton_reads_the_rest(server, case):
    """A request naming shared memory goes to Triton's front end, which sizes the JSON input from its shape first."""
    pid = server.process.pid
    status, answer = post(server.http_port, SCORER, SHAPE_PAST_DATA[case])
    assert status == 400, answer
    assert json.loads(answer)["error"] == "inputs[0].data: 1 values, and its shape holds 7696581394432", answer
    assert server.process.poll() is None and server.process.pid == pid


def test_nan_and_infinite_outputs_are_written_as_triton_writes_them(server):
    rows = np.zeros((3, 7), dtype=np.float32)
    rows[1, :] = np.nan
    rows[2, 0] = np.inf
    raw = rows.tobytes()
    head = json.dumps({"inputs": [
        {"name": "categorical", "datatype": "INT64", "shape": [3, 13], "data": [[0] * 13] * 3},
        {"name": "numeric", "datatype": "FP32", "shape": [3, 7], "parameters": {"binary_data_size": len(raw)}}]})
    headers = {"Inference-Header-Content-Length": str(len(head))}
    ours = post(server.http_port, SCORER, head.encode() + raw, headers)
    triton = post(server.triton_http_port, SCORER, head.encode() + raw, headers)
    assert ours[0] == 200 and ours == triton, (ours, triton)


def test_content_encoding_identity_is_no_coding(server, records):
    for value in ("identity", ""):
        assert post(server.http_port, PIPELINE, payload(records[:1]), {"Content-Encoding": value})[0] == 200, value


@pytest.mark.parametrize("header", ["Content-Length", "Content-Encoding"])
def test_a_header_given_twice_that_proxies_may_read_differently_is_refused(server, header):
    body = b"{}abc"
    second = {"Content-Length": b"Content-Length: 5\r\n", "Content-Encoding": b"Content-Encoding: gzip\r\n"}
    wire = (b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Encoding: gzip\r\n"
            if header == "Content-Encoding" else b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(wire + second[header] + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert f'"error":"{header}: given 2 times; a request has one"'.encode() in answer, answer
