"""An open-loop HTTP/1.1 load generator: requests sent on a fixed schedule whatever the server does, each request's
latency measured from the time it was scheduled, not from when a connection was free to send it.

wrk and h2load run closed loops (a connection sends its next request when the previous one is answered), so a slower
server is offered less load and its latency is measured at its own throughput. h2load's `--rps` and
`--timing-script-file` pace requests, but over HTTP/1.1 a connection still holds one request at a time, a request
waits for its connection without the wait being counted, and its latency is timed from when it is sent: the
coordinated omission that hides a server falling behind. Here every request's clock starts at its scheduled time; a
request that finds every connection of the pool busy waits in a queue, and that wait is in its latency.

Run as a process of its own (`python -m s2t.bench.load.open_loop`), so that its CPU is read like wrk's and h2load's
(process_tree.CpuSplit, the children of the bench); it prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

RESULT_PREFIX = "OPEN_LOOP_JSON "
# Achieved rate at least this share of the offered one, nothing unanswered, no error: the side kept up.
KEPT_UP_SHARE = 0.95


@dataclass(frozen=True)
class OpenLoopResult:
    offered_rate: float  # requests/s on the schedule
    seconds: float  # the schedule's length
    connections: int  # the pool, opened before the schedule starts
    scheduled: int
    answered: int  # 2xx responses
    errors: int  # non-2xx responses and broken connections
    unanswered: int  # no response before the run's end (the schedule's end and the grace time)
    achieved_rate: float  # answers over the time from the first scheduled send to the last answer
    p50_ms: float  # from each request's scheduled time to its whole response; answered requests
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    queued: int  # requests that found every connection busy and waited for one (the wait is in their latency)
    send_lag_p50_ms: float  # how late the generator itself sent (timer granularity, a busy core): in the latency
    send_lag_p99_ms: float
    # The generator's own CPU (user + system) over the measured schedule, per scheduled request: it runs on the
    # same cores as the server.
    cpu_ms_per_request: float = math.nan
    reconnects: int = 0  # connections the server closed, replaced to keep the pool's size

    @property
    def kept_up(self) -> bool:
        """The side answered the schedule: every request, no error, at (nearly) the offered rate."""
        return (self.errors == 0 and self.unanswered == 0
                and self.achieved_rate >= KEPT_UP_SHARE * self.offered_rate)

    def as_dict(self) -> dict:
        return {**asdict(self), "kept_up": self.kept_up}


def _percentile(ordered: list[float], q: float) -> float:
    from s2t.bench.harness.latency import percentile

    return percentile(ordered, q)


def request_bytes(host: str, route: str, body: bytes) -> bytes:
    return (f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection holding at most one request (HTTP/1.1 without pipelining, as clients send)."""

    def __init__(self, pool: "_Pool"):
        self.pool, self.transport, self.buffer = pool, None, b""
        self.scheduled: float | None = None  # of the request in flight
        self.dead = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send(self, scheduled: float, request: bytes) -> None:
        self.scheduled = scheduled
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.scheduled is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 17)
                total = end + 4 + int(head[at + 17:stop if stop >= 0 else None])
            elif b"\r\ntransfer-encoding: chunked" in head:
                last = self.buffer.find(b"0\r\n\r\n", end + 4)
                if last < 0:
                    return
                total = last + 5
            else:
                self.pool.broken(self, f"a response without a length (status {status})")
                return
            if len(self.buffer) < total:
                return
            self.buffer = self.buffer[total:]
            scheduled, self.scheduled = self.scheduled, None
            if b"\r\nconnection: close" in head:
                self.pool.answered(self, scheduled, status, reuse=False)
                self.pool.broken(self, "closed by the server after its answer")
                return
            self.pool.answered(self, scheduled, status)

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.pool.broken(self, f"connection closed ({exc})")


class _Pool:
    def __init__(self, requests: list[bytes], host: str, port: int):
        self.requests, self.next_request = requests, 0
        self.host, self.port = host, port
        self.opened: list[_Connection] = []
        self.reconnects = 0
        self.idle: deque[_Connection] = deque()
        self.waiting: deque[float] = deque()  # scheduled times of requests waiting for a connection
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.errors = self.answered_count = self.queued = 0
        self.last_answer = 0.0
        self.outstanding = 0
        self.recording = False
        self.closing = False  # the run is over: what is still in flight is unanswered, not broken
        self.error_reasons: list[str] = []

    def _request(self) -> bytes:
        request = self.requests[self.next_request % len(self.requests)]
        self.next_request += 1
        return request

    def _send(self, connection: _Connection, scheduled: float) -> None:
        connection.send(scheduled, self._request())

    def submit(self, scheduled: float) -> None:
        if self.recording:
            self.lags.append(time.monotonic() - scheduled)
        self.outstanding += 1
        if self.idle:
            self._send(self.idle.popleft(), scheduled)
        else:
            self.queued += self.recording
            self.waiting.append(scheduled)

    def answered(self, connection: _Connection, scheduled: float, status: int, reuse: bool = True) -> None:
        now = time.monotonic()
        self.outstanding -= 1
        if self.recording:
            if 200 <= status < 300:
                self.answered_count += 1
                self.latencies.append(now - scheduled)
                self.last_answer = now
            else:
                self.errors += 1
        if reuse:
            self._free(connection)

    def _free(self, connection: _Connection) -> None:
        if self.waiting:
            self._send(connection, self.waiting.popleft())
        else:
            self.idle.append(connection)

    async def connect(self) -> _Connection:
        _, connection = await asyncio.get_running_loop().create_connection(lambda: _Connection(self), self.host,
                                                                          self.port)
        self.opened.append(connection)
        self._free(connection)
        return connection

    async def _replace(self) -> None:
        try:
            await self.connect()
        except OSError as err:
            if len(self.error_reasons) < 5:
                self.error_reasons.append(f"reconnecting: {err}")

    def broken(self, connection: _Connection, reason: str) -> None:
        if self.closing or connection.dead:
            return
        connection.dead = True
        # A server may close a keep-alive connection (an idle timeout, a limit of requests): the pool keeps its size.
        self.reconnects += 1
        asyncio.get_running_loop().create_task(self._replace())
        if connection.scheduled is not None:
            connection.scheduled = None
            self.outstanding -= 1
            self.errors += self.recording
            if len(self.error_reasons) < 5:
                self.error_reasons.append(reason)
        if connection in self.idle:
            self.idle.remove(connection)
        if connection.transport is not None:
            connection.transport.close()


async def _schedule(pool: _Pool, rate: float, seconds: float) -> tuple[float, int]:
    """Submits a request at each scheduled time (every 1/rate s) for `seconds`; returns the start and the count."""
    count = max(1, round(rate * seconds))
    start = time.monotonic() + 0.01
    for number in range(count):
        due = start + number / rate
        ahead = due - time.monotonic()
        if ahead > 0.0005:
            await asyncio.sleep(ahead)
        pool.submit(due)
        if number % 64 == 63:
            await asyncio.sleep(0)  # lets answers in when the schedule is behind
    return start, count


async def run_async(host: str, port: int, route: str, bodies: list[bytes], rate: float, seconds: float,
                    connections: int, warmup_s: float = 1.0, grace_s: float = 2.0) -> tuple[OpenLoopResult, list[str]]:
    pool = _Pool([request_bytes(f"{host}:{port}", route, body) for body in bodies], host, port)
    for _ in range(connections):
        await pool.connect()
    if warmup_s > 0:
        await _schedule(pool, rate, warmup_s)
        await _drained(pool, grace_s)
    pool.recording = True
    cpu_before = time.process_time()
    start, count = await _schedule(pool, rate, seconds)
    await _drained(pool, grace_s, until=start + seconds + grace_s)
    cpu = time.process_time() - cpu_before
    unanswered = pool.outstanding
    pool.closing = True
    for connection in pool.opened:
        if connection.transport is not None:
            connection.transport.close()
    ordered = sorted(pool.latencies)
    span = (pool.last_answer - start) if pool.answered_count else 0.0
    ms = [1000 * v for v in ordered]
    result = OpenLoopResult(
        offered_rate=rate, seconds=seconds, connections=connections, scheduled=count, answered=pool.answered_count,
        errors=pool.errors, unanswered=unanswered,
        achieved_rate=pool.answered_count / max(span, seconds) if span > 0 else 0.0,
        p50_ms=_percentile(ms, 50), p90_ms=_percentile(ms, 90), p99_ms=_percentile(ms, 99),
        max_ms=ms[-1] if ms else math.nan, mean_ms=sum(ms) / len(ms) if ms else math.nan, queued=pool.queued,
        send_lag_p50_ms=_percentile(sorted(1000 * v for v in pool.lags), 50),
        send_lag_p99_ms=_percentile(sorted(1000 * v for v in pool.lags), 99), cpu_ms_per_request=1000 * cpu / count,
        reconnects=pool.reconnects)
    return result, pool.error_reasons


async def _drained(pool: _Pool, grace_s: float, until: float | None = None) -> None:
    """Waits until nothing is outstanding, or until `until` (the schedule's end and the grace time)."""
    deadline = until if until is not None else time.monotonic() + grace_s
    while pool.outstanding > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--route", required=True)
    parser.add_argument("--bodies", type=Path, required=True, help="a JSON list of request bodies (strings), cycled")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds at the rate before the measured schedule")
    args = parser.parse_args(argv)
    bodies = [b.encode() for b in json.loads(args.bodies.read_text())]
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # plain asyncio costs more CPU per request; the bench records it either way
        runner = asyncio.run
    result, reasons = runner(run_async(args.host, args.port, args.route, bodies, args.rate, args.seconds,
                                       args.connections, args.warmup))
    print(RESULT_PREFIX + json.dumps({**result.as_dict(), "error_reasons": reasons}), flush=True)
    return 0


def parse(output: str) -> tuple[OpenLoopResult, list[str]]:
    line = next((ln for ln in output.splitlines() if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        raise RuntimeError(f"the open-loop generator printed no result:\n{output[-2000:]}")
    raw = json.loads(line[len(RESULT_PREFIX):])
    reasons = raw.pop("error_reasons", [])
    raw.pop("kept_up", None)
    return OpenLoopResult(**{k: (math.nan if v is None else v) for k, v in raw.items()}), reasons


def write_bodies(path: Path, bodies: list[str]) -> Path:
    path.write_text(json.dumps(bodies))
    return path


def run(url: str, route: str, bodies: Path, rate: float, seconds: float, connections: int = 64,
        warmup_s: float = 1.0) -> tuple[OpenLoopResult, list[str]]:
    """`url` is http://host:port; `bodies` a file of `write_bodies`. Runs the generator as a child process."""
    import subprocess

    host, _, port = url.removeprefix("http://").rpartition(":")
    proc = subprocess.run([sys.executable, "-m", "s2t.bench.load.open_loop", "--host", host or "127.0.0.1",
                           "--port", port, "--route", route, "--bodies", str(bodies), "--rate", repr(float(rate)),
                           "--seconds", repr(float(seconds)), "--connections", str(connections),
                           "--warmup", repr(float(warmup_s))],
                          capture_output=True, text=True, timeout=seconds + warmup_s + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"the open-loop generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return parse(proc.stdout)


if __name__ == "__main__":
    sys.exit(main())
