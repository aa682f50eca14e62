"""The relay that makes a caller on this machine look like one from elsewhere: what it passes on, and that its
close() ends every connection it holds, also those waiting for bytes."""
from __future__ import annotations

import socket
import threading
import time

from s2t.soak.from_address import ELSEWHERE, FromAddress


def pumps() -> int:
    return sum(t.name == "from-address-pump" for t in threading.enumerate())


def until(condition, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_connection_reaches_the_server_from_the_other_address_and_a_half_close_still_gets_its_answer():
    with socket.create_server(("127.0.0.1", 0)) as server:
        relay = FromAddress(ELSEWHERE, server.getsockname()[1])
        try:
            client = socket.create_connection(("127.0.0.1", int(relay.url.rsplit(":", 1)[1])), timeout=3)
            peer, (address, _) = server.accept()
            assert address == ELSEWHERE
            client.sendall(b"question")
            client.shutdown(socket.SHUT_WR)
            asked = b""
            peer.settimeout(3)
            while chunk := peer.recv(100):
                asked += chunk
            assert asked == b"question"  # and the end of what was asked arrived as an end
            peer.sendall(b"answer")
            peer.close()
            answer = b""
            while chunk := client.recv(100):
                answer += chunk
            assert answer == b"answer"
            client.close()
            assert until(lambda: pumps() == 0)
        finally:
            relay.close()


def test_close_ends_connections_whose_pumps_wait_for_bytes():
    with socket.create_server(("127.0.0.1", 0)) as server:
        relay = FromAddress(ELSEWHERE, server.getsockname()[1])
        clients = [socket.create_connection(("127.0.0.1", int(relay.url.rsplit(":", 1)[1])), timeout=3)
                   for _ in range(3)]
        peers = [server.accept()[0] for _ in clients]
        assert until(lambda: pumps() == 6)
        relay.close()
        for end in clients + peers:
            end.settimeout(3)
            assert end.recv(100) == b""  # an end now, not a wait
            end.close()
        assert until(lambda: pumps() == 0)
