"""`s2t stream`: replay German Credit records on N streams through risk_stream, over gRPC bidirectional streams.

Each stream sends its records with some of them shuffled within a window, duplicated or lost, and checks what
comes back: in-order OK answers, LATE, GAP and DUPLICATE answers, errors, requests closed without an answer;
latency per record and throughput over all streams. One gRPC stream (and one sender thread) per record stream, as real
callers are.
"""
from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from s2t.clients.legacy_record import encode
from s2t.wire.names import DECISION, PAYLOAD, PROBABILITY

MODEL = "risk_stream"


def plan(n: int, *, shuffle: float = 0.0, window: int = 0, duplicate: float = 0.0, loss: float = 0.0,
         rng: random.Random) -> list[int]:
    """The order in which a stream sends its sequence ids 0..n-1: a `shuffle` fraction is delayed by up to
    `window` places (so no record gets more than `window` ids ahead of a missing one), a `duplicate` fraction is
    sent again up to `window` places later, a `loss` fraction is never sent."""
    kept = [i for i in range(n) if rng.random() >= loss]
    keyed = [(place + (rng.uniform(0, window) if rng.random() < shuffle else 0.0), i) for place, i in enumerate(kept)]
    copies = [(key + rng.uniform(0, window) + 1e-6, i) for key, i in keyed if rng.random() < duplicate]
    return [i for _, i in sorted(keyed + copies)]


@dataclass(frozen=True)
class Answer:
    status: str  # OK, LATE, GAP or DUPLICATE
    sequence_id: int
    last_id: int  # GAP: the last id given up; otherwise sequence_id
    probability: float
    decision: str
    latency_s: float


def parse_status(status: str, sequence_id: int) -> tuple[str, int]:
    """("GAP", last id) from "GAP 4-9"; (status, sequence_id) otherwise."""
    if status.startswith("GAP "):
        first, _, last = status[4:].partition("-")
        if int(first) != sequence_id:
            raise ValueError(f"GAP answer {status!r} carries sequence_id {sequence_id}")
        return "GAP", int(last)
    return status, sequence_id


@dataclass
class StreamResult:
    stream: str
    sent: list[int]
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finals: int = 0
    complete: bool = False

    @property
    def ok_ids(self) -> list[int]:
        return [a.sequence_id for a in self.answers if a.status == "OK"]

    @property
    def in_order(self) -> bool:
        ids = self.ok_ids
        return all(a < b for a, b in zip(ids, ids[1:]))


@dataclass(frozen=True)
class Summary:
    streams: int
    sent: int
    ok: int
    late: int
    gap_ids: int
    duplicates: int
    dropped: int  # requests closed without any answer
    errors: int
    in_order_rate: float
    exactly_once: bool
    latency_ms: Mapping[str, float]
    seconds: float

    @property
    def throughput(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else float("nan")

    def table(self) -> str:
        lat = "  ".join(f"{k} {v:.1f} ms" for k, v in self.latency_ms.items())
        return "\n".join([
            f"streams {self.streams}  records sent {self.sent}  in {self.seconds:.2f} s  "
            f"throughput {self.throughput:.0f} records/s",
            f"OK {self.ok}  LATE {self.late}  GAP ids {self.gap_ids}  DUPLICATE {self.duplicates}  "
            f"unanswered {self.dropped}  errors {self.errors}",
            f"in-order rate {self.in_order_rate:.4f}  exactly once {'yes' if self.exactly_once else 'NO'}",
            f"latency (send to answer, OK records) {lat}",
        ])


def summarize(results: Sequence[StreamResult], seconds: float) -> Summary:
    in_order = sum(r.in_order for r in results)
    once = True
    for r in results:
        answered = [a.sequence_id for a in r.answers if a.status in ("OK", "LATE")]
        once &= len(answered) == len(set(answered)) and set(answered) <= set(r.sent)
    latencies = np.array([a.latency_s for r in results for a in r.answers if a.status == "OK"]) * 1000.0
    percentiles = {f"p{q}": float(np.percentile(latencies, q)) if latencies.size else float("nan")
                   for q in (50, 95, 99)}
    answers = [a for r in results for a in r.answers]
    answered_requests = sum(1 for a in answers if a.status != "GAP") + sum(len(r.errors) for r in results)
    return Summary(
        streams=len(results), sent=sum(len(r.sent) for r in results),
        ok=sum(a.status == "OK" for a in answers), late=sum(a.status == "LATE" for a in answers),
        gap_ids=sum(a.last_id - a.sequence_id + 1 for a in answers if a.status == "GAP"),
        duplicates=sum(a.status == "DUPLICATE" for a in answers),
        dropped=sum(r.finals for r in results) - answered_requests, errors=sum(len(r.errors) for r in results),
        in_order_rate=in_order / len(results) if results else float("nan"),
        exactly_once=once, latency_ms=percentiles, seconds=seconds)


def run_stream(url: str, stream: str, records: Sequence[Mapping], order: Sequence[int], *, form: str = "json",
               model: str = MODEL, timeout_s: float = 60.0, payloads: Mapping[int, bytes] | None = None,
               wait_for: Mapping[int, tuple[str, int]] | None = None, rate: float = 0.0,
               admission_timeout_s: float = 0.0) -> StreamResult:
    """Send `records[i]` as sequence id i, in `order`, on one gRPC stream; wait for every request's final
    response (empty finals included, so dropped duplicates are seen to be closed). `payloads` overrides the
    bytes sent at given places of `order` (a malformed record, say); `wait_for` holds a given place back until an
    answer (status, sequence_id) has come, e.g. ("GAP", 2) for a record that must arrive after it was given up; `rate`
    paces the sends (records per second; 0 sends as fast as possible, which measures queueing more than latency).
    `admission_timeout_s` (0: none) is how long the stream may wait for a slot of risk_stream's batcher: beyond it
    Triton refuses the stream's records UNAVAILABLE rather than letting them wait."""
    import tritonclient.grpc as grpcclient

    result = StreamResult(stream, list(order))
    sent_at: dict[str, float] = {}
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((time.perf_counter(), result, error)))
    try:
        started = time.perf_counter()
        for place, sequence_id in enumerate(order):
            if rate > 0:
                time.sleep(max(0.0, started + place / rate - time.perf_counter()))
            if wait_for and place in wait_for:
                status, awaited_id, waited_until = *wait_for[place], time.monotonic() + timeout_s
                while not any((a.status, a.sequence_id) == (status, awaited_id) for a in result.answers):
                    if not _receive(result, responses, waited_until, sent_at):
                        raise TimeoutError(f"{stream}: no {status} answer for sequence_id {awaited_id} "
                                           f"within {timeout_s:.0f} s")
            if payloads and place in payloads:
                payload = payloads[place]
            else:
                payload = encode({**records[sequence_id], "request_id": f"{stream}/{place}", "stream_id": stream,
                                  "sequence_id": sequence_id}, form)
            tensor = grpcclient.InferInput(PAYLOAD, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
            sent_at[str(place)] = time.perf_counter()
            # The timeout only bounds the wait for a sequence slot (Triton's backlog); it rides on the START request.
            timeout_us = int(admission_timeout_s * 1e6) if place == 0 and admission_timeout_s > 0 else None
            client.async_stream_infer(model, [tensor], request_id=str(place), sequence_id=stream,
                                      sequence_start=place == 0, sequence_end=place == len(order) - 1,
                                      enable_empty_final_response=True, timeout=timeout_us)
        deadline = time.monotonic() + timeout_s
        while result.finals < len(order) and _receive(result, responses, deadline, sent_at):
            pass
        result.complete = result.finals == len(order)
    finally:
        client.stop_stream()
        client.close()
    return result


def _receive(result: StreamResult, responses: queue.Queue, deadline: float, sent_at: Mapping[str, float]) -> bool:
    """Take in the next response; False when none came before `deadline`."""
    try:
        received, answer, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return False
    _record(result, received, answer, error, sent_at)
    return True


def _record(result: StreamResult, received: float, answer, error, sent_at: Mapping[str, float]) -> None:
    if error is not None:
        # Every error risk_stream sends is its request's final response.
        result.errors.append(error.message() if hasattr(error, "message") else str(error))
        result.finals += 1
        return
    response = answer.get_response()
    if response.parameters["triton_final_response"].bool_param:
        result.finals += 1
    status = answer.as_numpy("status")
    if status is None:
        return
    sequence_id = int(answer.as_numpy("sequence_id").ravel()[0])
    kind, last = parse_status(status.ravel()[0].decode(), sequence_id)
    result.answers.append(Answer(kind, sequence_id, last, float(answer.as_numpy(PROBABILITY).ravel()[0]),
                                 answer.as_numpy(DECISION).ravel()[0].decode(),
                                 received - sent_at.get(response.id, received)))


def replay(url: str, records: Sequence[Mapping], streams: int, *, shuffle: float = 0.0, window: int = 0,
           duplicate: float = 0.0, loss: float = 0.0, form: str = "json", seed: int = 0, model: str = MODEL,
           timeout_s: float = 120.0, rate: float = 0.0) -> tuple[list[StreamResult], list[list[int]], float]:
    """Records dealt round-robin to `streams` streams, all sent concurrently. Returns the results, the record
    index of each stream's sequence ids, and the wall time."""
    rows = [list(range(k, len(records), streams)) for k in range(streams)]
    rng = random.Random(seed)
    # Fresh stream names per run: Triton refuses a new START on a name whose last sequence is still closing.
    run = uuid.uuid4().hex[:8]
    orders = [plan(len(r), shuffle=shuffle, window=window, duplicate=duplicate, loss=loss, rng=rng) for r in rows]
    results: list[StreamResult | None] = [None] * streams

    def worker(k: int) -> None:
        results[k] = run_stream(url, f"{run}-s{k}", [records[i] for i in rows[k]], orders[k], form=form,
                                model=model, timeout_s=timeout_s, rate=rate)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(streams)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, rows, time.perf_counter() - started
