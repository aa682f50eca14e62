"""The open-loop generator against a small HTTP/1.1 server in a process of its own: requests go out on the schedule
whatever the server does, and a server that falls behind pays for its queue in the latency (no coordinated
omission)."""
import subprocess
import sys

import pytest

from s2t.bench.load import open_loop

# Answers each request after `delay` seconds of work that holds the whole server (one request at a time); prints its
# port.
SERVER = r"""
import asyncio, sys, time
DELAY = float(sys.argv[1])
CLOSE_EVERY = int(sys.argv[2])  # closes each connection after this many answers, saying so (0: never)
class Answer(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer, self.answers = transport, b"", 0
    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length = next(int(line.split(b":")[1]) for line in self.buffer[:end].split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            if len(self.buffer) < end + 4 + length:
                return
            status = b"400 Bad Request" if b"refuse" in self.buffer[end + 4:end + 4 + length] else b"200 OK"
            self.buffer = self.buffer[end + 4 + length:]
            time.sleep(DELAY)
            self.answers += 1
            closing = CLOSE_EVERY and self.answers % CLOSE_EVERY == 0
            self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n"
                                 + (b"Connection: close\r\n" if closing else b"") + b"\r\n{}")
            if closing:
                self.transport.close()
                return
async def main():
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


@pytest.fixture
def server_of(tmp_path):
    started = []

    def start(delay_s: float, close_every: int = 0) -> str:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(delay_s), str(close_every)], stdout=subprocess.PIPE,
                                text=True)
        started.append(proc)
        return f"http://127.0.0.1:{int(proc.stdout.readline())}"

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)


def bodies(tmp_path, *texts):
    return open_loop.write_bodies(tmp_path / "bodies.json", list(texts))


def test_a_server_that_keeps_up_answers_the_whole_schedule_at_the_offered_rate(server_of, tmp_path):
    found, reasons = open_loop.run(server_of(0.0), "/score", bodies(tmp_path, '{"a": 1}'), rate=200, seconds=1.0,
                                   connections=8, warmup_s=0.2)
    assert reasons == []
    assert found.scheduled == found.answered == 200 and found.errors == found.unanswered == 0
    assert found.kept_up and found.achieved_rate == pytest.approx(200, rel=0.05)
    assert 0 < found.p50_ms <= found.p99_ms <= found.max_ms
    # The generator's own CPU per request is measured over the schedule.
    assert 0 < found.cpu_ms_per_request < 5


def test_latency_runs_from_the_scheduled_time_so_a_server_that_falls_behind_pays_for_its_queue(server_of, tmp_path):
    """10 ms of work a request, one at a time: 100 req/s at most, offered 200. A closed loop would time each answer
    from its send (about 10 ms); here the queue grows over the schedule and so do the latencies."""
    found, _ = open_loop.run(server_of(0.010), "/score", bodies(tmp_path, '{"a": 1}'), rate=200, seconds=1.0,
                             connections=4, warmup_s=0)
    assert not found.kept_up and found.achieved_rate < 150
    assert found.queued > 0  # requests waited for a busy connection: the wait is in their latency
    assert found.p99_ms > 300 and found.max_ms > 300
    # The generator itself was on time: the lateness is the server's.
    assert found.send_lag_p50_ms < 5


def test_error_answers_are_never_counted_as_answers(server_of, tmp_path):
    found, _ = open_loop.run(server_of(0.0), "/score", bodies(tmp_path, '{"a": 1}', '{"refuse": 1}'), rate=100,
                             seconds=0.5, connections=4, warmup_s=0)
    assert found.answered == found.errors == 25 and not found.kept_up


def test_a_connection_the_server_closes_is_replaced_and_no_request_is_lost(server_of, tmp_path):
    found, reasons = open_loop.run(server_of(0.0, close_every=5), "/score", bodies(tmp_path, '{"a": 1}'), rate=200,
                                   seconds=1.0, connections=4, warmup_s=0)
    assert found.answered == found.scheduled == 200 and found.errors == found.unanswered == 0, reasons
    assert found.reconnects >= 200 // 5 - 4 and found.kept_up
