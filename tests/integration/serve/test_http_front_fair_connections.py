"""The HTTP front's connections are shared fairly between source addresses (native/http_front.cc `Connections`): a
few addresses that take every connection with heads they never finish keep no other address out (a new peer's
connection takes the place of the oldest unfinished one of the peer holding most), a head must arrive within
--head-seconds of its first byte, and a body may take longer. Each beside valid inference, from the same
tritonserver."""
from __future__ import annotations

import json
import select
import socket
import threading
import time

import pytest
import requests

from s2t.serve import http_front
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from tests.integration.servers import serving, triton_server
from tests.integration.traffic import PACE_S

PLAIN = {"Accept-Encoding": "identity"}
MAX_CONNECTIONS = 64
HEAD_SECONDS = 2
# Source addresses that take every connection between them (loopback answers all of 127/8 on Linux).
TAKERS = [f"127.0.0.{i}" for i in range(2, 10)]
UNFINISHED_HEAD = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n"
READY = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.fixture(scope="module")
def server(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("http_front_fair") / "tritonserver.log"
    patch = pytest.MonkeyPatch()
    patch.setattr(http_front, "DEFAULT_MAX_CONNECTIONS", MAX_CONNECTIONS)
    patch.setattr(http_front, "DEFAULT_HEAD_SECONDS", HEAD_SECONDS)
    try:
        with serving(triton_server([MODEL_REPOSITORY, ENSEMBLES], log)) as running:
            yield running
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def request_body(german_credit_data) -> bytes:
    items = [json.dumps({"request_id": "r-0", "features": german_credit_data.records()[0]})]
    return json.dumps({"inputs": [{"name": "payload", "datatype": "BYTES", "shape": [1, 1], "data": items}]}).encode()


def connect_from(source: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


class Takers:
    """Each address keeps MAX_CONNECTIONS / len(TAKERS) connections open with an unfinished head, trickling a byte
    now and then, and opens a new one whenever the front closes one."""

    def __init__(self, port: int):
        self.port = port
        self.stop = threading.Event()
        self.opened = 0
        # Their connections the front closed without an answer (a head cut at --head-seconds, or a connection given
        # to a newcomer), and those it answered 503 at once (every connection taken, none to give).
        self.cut = 0
        self.refused = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open(self, source: str) -> socket.socket | None:
        try:
            sock = connect_from(source, self.port)
            sock.sendall(UNFINISHED_HEAD)
            self.opened += 1
            return sock
        except OSError:
            return None

    def run(self) -> None:
        share = MAX_CONNECTIONS // len(TAKERS)
        held = {source: [] for source in TAKERS}
        last_trickle = time.monotonic()
        while not self.stop.is_set():
            for source, socks in held.items():
                while len(socks) < share:
                    sock = self.open(source)
                    if sock is None:
                        break
                    socks.append(sock)
            every = [sock for socks in held.values() for sock in socks]
            readable = select.select(every, [], [], 0.05)[0] if every else []
            for sock in readable:  # answered (503) or closed: replaced on the next round
                try:
                    said = sock.recv(64)
                except OSError:
                    said = b""
                if said.startswith(b"HTTP/1.1 503"):
                    self.refused += 1
                elif not said:
                    self.cut += 1
                for socks in held.values():
                    if sock in socks:
                        socks.remove(sock)
                sock.close()
            if time.monotonic() - last_trickle > 0.5:
                last_trickle = time.monotonic()
                for sock in every:
                    if sock not in readable:
                        try:
                            sock.sendall(b"X")
                        except OSError:
                            pass
        for socks in held.values():
            for sock in socks:
                sock.close()


def test_addresses_holding_every_connection_with_unfinished_heads_keep_no_one_out(server, request_body):
    pid, port = server.process.pid, server.http_port
    takers = Takers(port)
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def infer() -> None:
        with requests.Session() as session:
            while not stop.wait(PACE_S):
                started = time.monotonic()
                try:
                    answer = session.post(f"http://127.0.0.1:{port}/v2/models/risk_pipeline/infer",
                                          data=request_body, headers=PLAIN, timeout=10)
                    if answer.status_code != 200:
                        failures.append(f"infer {answer.status_code} {answer.text[:200]}")
                    else:
                        answered[0] += 1
                except requests.RequestException as err:
                    failures.append(f"infer {err!r}")
                # Far less than a head's deadline: a valid request never waits for a connection to be freed.
                if time.monotonic() - started > 5:
                    failures.append(f"infer took {time.monotonic() - started:.1f} s")

    takers.thread.start()
    try:
        deadline = time.monotonic() + 5
        while takers.opened < MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert takers.opened >= MAX_CONNECTIONS
        time.sleep(0.3)
        inferring = threading.Thread(target=infer)
        inferring.start()
        end = time.monotonic() + 3 * HEAD_SECONDS + 2  # heads cut and taken again several times over
        probes = 0
        while time.monotonic() < end:
            started = time.monotonic()
            with connect_from("127.0.0.1", port) as probe:
                probe.sendall(READY)
                answer = b""
                while not answer.endswith(b"true") and b"\r\n\r\n" not in answer:
                    chunk = probe.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            took = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert took < 5, took
            probes += 1
            time.sleep(0.1)
        stop.set()
        inferring.join(15)
    finally:
        stop.set()
        takers.stop.set()
        takers.thread.join(10)
    assert not failures, failures[:5]
    assert probes > 10 and answered[0] > 10
    # The takers kept coming back: their connections were cut (not only refused) and taken again.
    assert takers.cut > MAX_CONNECTIONS, (takers.cut, takers.refused)
    assert server.process.poll() is None and server.process.pid == pid


def test_a_head_is_cut_at_head_seconds_and_a_body_may_take_longer(server, request_body):
    pid, port = server.process.pid, server.http_port
    with connect_from("127.0.0.2", port) as slow_head:
        slow_head.sendall(b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\n")
        started, closed = time.monotonic(), False
        while time.monotonic() - started < HEAD_SECONDS + 4 and not closed:
            try:
                slow_head.sendall(b"X")  # a byte every quarter second: never idle
                if select.select([slow_head], [], [], 0.25)[0]:
                    closed = slow_head.recv(4096) == b""
            except OSError:
                closed = True
        # Cut by the once-a-second sweep after HEAD_SECONDS, well before the request's own deadline (60 s).
        assert closed and time.monotonic() - started < HEAD_SECONDS + 4
    with connect_from("127.0.0.3", port) as slow_body:
        slow_body.sendall(b"POST /v2/models/risk_pipeline/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                          b"\r\nContent-Length: %d\r\n\r\n" % len(request_body))
        pieces = 12
        step = -(-len(request_body) // pieces)
        for i in range(0, len(request_body), step):  # the body over 3 s, past the head's deadline
            slow_body.sendall(request_body[i:i + step])
            time.sleep(3 / pieces)
        answer = slow_body.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
    assert server.process.poll() is None and server.process.pid == pid
