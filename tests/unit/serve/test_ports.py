"""The ports tests and `s2t bench` give their servers, and what a server that dies before it is ready leaves in its
error."""
import collections
import fcntl
import os
import socket
import subprocess
import sys

import pytest

from s2t.serve import triton_server
from s2t.serve.triton_server import LOWEST_PORT, ServerError, TritonServer, ephemeral_floor, free_port


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(triton_server, "_handed_out", set())
    monkeypatch.setattr(triton_server, "_reservations", collections.deque())
    monkeypatch.setattr(triton_server, "PORT_RESERVATIONS", tmp_path / "ports")
    return tmp_path / "ports"


@pytest.mark.parametrize("text, floor", [("32768\t60999\n", 32768), ("20000 30000", 20000), ("", 32768),
                                         ("x y", 32768)])
def test_the_ephemeral_floor_is_read_from_the_kernel_or_linuxs_default(tmp_path, text, floor):
    (tmp_path / "range").write_text(text)
    assert ephemeral_floor(tmp_path / "range") == floor
    assert ephemeral_floor(tmp_path / "missing") == 32768


def test_ports_lie_below_the_ephemeral_range_are_bindable_and_never_handed_out_twice(fresh):
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < ephemeral_floor() for port in ports)
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))


def test_a_bound_port_is_skipped_and_an_exhausted_range_says_so(fresh):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", LOWEST_PORT))
        # Three ports in the range, one bound elsewhere: the other two, then none.
        assert {free_port(floor=LOWEST_PORT + 3), free_port(floor=LOWEST_PORT + 3)} == {LOWEST_PORT + 1,
                                                                                       LOWEST_PORT + 2}
        with pytest.raises(OSError, match=f"no free port between {LOWEST_PORT} and {LOWEST_PORT + 2}"):
            free_port(floor=LOWEST_PORT + 3)


HOLDER = """
import sys
from pathlib import Path
from s2t.serve import triton_server
triton_server.PORT_RESERVATIONS = Path(sys.argv[1])
print(" ".join(str(triton_server.free_port()) for _ in range(20)), flush=True)
sys.stdin.read()
"""


def test_a_port_another_process_drew_is_not_handed_out_until_its_reservation_ends(fresh):
    """Two test workers draw from the same range: a port one of them drew moments ago is not the other's, even
    before its server binds it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(fresh)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        theirs = [int(p) for p in holder.stdout.readline().split()]
        assert len(set(theirs)) == 20
        assert not any(triton_server._reserve(port) for port in theirs)
    finally:
        holder.stdin.close()
        holder.wait(10)
    # The holder has gone: its reservations went with it.
    assert all(triton_server._reserve(port) for port in theirs)


def test_a_reservation_is_released_once_its_server_had_time_to_bind(fresh, monkeypatch):
    monkeypatch.setattr(triton_server, "RESERVATION_SECONDS", 0.0)
    first = free_port()
    free_port()  # releases the first's reservation, which is older than 0 s
    # Another process (here another open file) may reserve the first port again; this process still never hands
    # it out twice.
    fd = os.open(fresh / str(first), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert first in triton_server._handed_out


def test_a_server_that_exits_before_it_is_ready_carries_its_logs_end_in_the_error(tmp_path):
    log = tmp_path / "tritonserver.log"
    log.write_text("".join(f"line {i}\n" for i in range(100))
                   + "E1204 failed to start HTTP service: Address already in use\n")
    server = TritonServer([tmp_path], free_port(), free_port(), free_port(), log_path=log)
    server.process = subprocess.Popen(["sh", "-c", "exit 1"])
    server.process.wait()
    with pytest.raises(ServerError) as raised:
        server.wait_ready(5)
    message = str(raised.value)
    assert message.startswith(f"tritonserver exited with code 1 before it was ready; see {log}, which ends:\n")
    assert message.endswith("line 99\nE1204 failed to start HTTP service: Address already in use")
    assert "line 85" not in message
