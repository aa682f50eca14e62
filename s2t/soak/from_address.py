"""A TCP relay whose connections reach a server on this machine from another loopback address.

Every 127/8 address is this machine's, so a client on it can stand for a client elsewhere: the server counts shares
by the address a caller connects from, and a soak or test that sends its hostile and its valid callers from one
address would only measure that address against itself.
"""
from __future__ import annotations

import ipaddress
import socket
import threading

# The address hostile callers take when the server is on loopback; valid ones keep 127.0.0.1.
ELSEWHERE = "127.0.0.2"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class FromAddress:
    """Listens on 127.0.0.1 (its `url`) and relays each connection to `host:port` from `source`, byte for byte, a
    half-close passed on, until both directions have ended; `close()` ends the listener and every connection."""

    def __init__(self, source: str, port: int, host: str = "127.0.0.1"):
        self.source, self.host, self.port = source, host, port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        # Each relayed connection's two sockets -> how many of its two directions still run.
        self._pairs: dict[tuple[socket.socket, socket.socket], int] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="from-address", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection((self.host, self.port), source_address=(self.source, 0))
            except OSError:
                down.close()
                continue
            pair = (down, up)
            with self._lock:
                self._pairs[pair] = 2
            for a, b in (pair, (up, down)):
                threading.Thread(target=self._pump, args=(a, b, pair), name="from-address-pump",
                                 daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)  # the half-close goes on; the other direction may still answer
        except OSError:
            _shut(a, b)  # a broken direction ends the connection both ways
        with self._lock:
            self._pairs[pair] -= 1
            ended = self._pairs[pair] == 0
            if ended:
                del self._pairs[pair]
        if ended:
            for s in pair:
                s.close()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            pairs = list(self._pairs)
        # Shut down, not only closed: a pump blocked in recv() holds its socket open until then (a close from another
        # thread neither wakes it nor sends anything); the pumps then close what they hold.
        for pair in pairs:
            _shut(*pair)


def _shut(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
