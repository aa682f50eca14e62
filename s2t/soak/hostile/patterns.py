"""The hostile patterns the soak lets loose in `during`, their sizes (`--floods full` / `light`), and the run of
all of them at once, each in its own thread, each reported with what it got back."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from s2t.soak.hostile import careless_callers, floods, wire_attacks
from s2t.soak.hostile.valid_paths import Clock
from s2t.soak.hostile.watch import metrics_page


@dataclass(frozen=True)
class FloodSizes:
    idle_streams: int
    idle_gateway_calls: int
    big_record_callers: int
    big_records_per_call: int
    llm_disconnects: int
    bogus_routes: int
    oversized_bodies: int
    oversized_body_bytes: int
    grpc_deadline_calls: int
    # Calls a second the deadline callers make at most (0: as fast as they can).
    grpc_deadline_rate: float
    cancelled_streams: int
    invalid_record_requests: int
    malformed_bytes_requests: int
    bytes_classification_requests: int
    damaged_streams: int
    overlong_varint_requests: int
    # The greedy client: ModelInfer calls whose message never comes, and streams that never send.
    greedy_held_calls: int
    greedy_silent_streams: int


# full: the sizes that showed each weakness; light: enough of each to see it act, for a minute's run. gRPC deadlines:
# 4 callers took Triton 2.51's own gRPC front end down within a few thousand calls, so both sizes keep them calling
# through most of `during`; the full run at 300 calls a second, so that the other paths' latency shows the callers'
# effect rather than two cores given over to them (unpaced, about 1,000 a second here).
FLOOD_SIZES = {
    "full": FloodSizes(idle_streams=1100, idle_gateway_calls=8, big_record_callers=4, big_records_per_call=200,
                       llm_disconnects=300, bogus_routes=6000, oversized_bodies=10, oversized_body_bytes=64 << 20,
                       grpc_deadline_calls=90_000, grpc_deadline_rate=300.0, cancelled_streams=300,
                       invalid_record_requests=5000, malformed_bytes_requests=2000,
                       bytes_classification_requests=2000, damaged_streams=600, overlong_varint_requests=2000,
                       greedy_held_calls=1200, greedy_silent_streams=300),
    "light": FloodSizes(idle_streams=150, idle_gateway_calls=4, big_record_callers=2, big_records_per_call=10,
                        llm_disconnects=6, bogus_routes=100, oversized_bodies=2, oversized_body_bytes=16 << 20,
                        grpc_deadline_calls=20_000, grpc_deadline_rate=0.0, cancelled_streams=20,
                        invalid_record_requests=250, malformed_bytes_requests=100,
                        bytes_classification_requests=100, damaged_streams=30, overlong_varint_requests=100,
                        greedy_held_calls=100, greedy_silent_streams=30),
}
# Threads of each caller flood: the deadline callers as many as took the server down; the others a few, enough to
# share batches with the valid paths.
GIVING_UP_CALLERS = 4
STREAM_CANCELLERS = 2
CARELESS_CALLERS = 4
# The floods of requests that are the caller's mistake, each answered on its own (bad_requests.count).
CALLER_ERROR_FLOODS = ("invalid_records", "malformed_bytes")
# The floods below the level of a record (wire_attacks), each with a verdict of its own: name -> what it holds.
WIRE_ATTACK_FLOODS = {
    "bytes_classification": "every classification of a BYTES output refused (HTTP 400, INVALID_ARGUMENT, the "
                            "stream's error) and the valid requests beside it scored",
    "damaged_streams": "every damaged stream ended with a status (each message answered where all parse), and "
                       "a valid request after each scored",
    "overlong_varints": "every overlong varint answered or refused, past 10 bytes refused, never a server "
                        "failure or silence; the valid requests beside them scored",
    "greedy_client": "a second client's ServerReady, ServerLive and ModelInfer answered while one client held "
                     "calls whose message never came and streams that never spoke",
}
# Seeds of the generated requests: the same run sends the same requests.
WIRE_SEED = 2051
FLOOD_NAMES = ("idle_streams", "idle_gateway_calls", "big_records", "llm_disconnects", "bogus_routes",
               "oversized_bodies", "grpc_deadlines", "cancelled_streams", *CALLER_ERROR_FLOODS, *WIRE_ATTACK_FLOODS)


def run_floods(sizes: FloodSizes, urls: Mapping[str, str], records: Sequence[Mapping], clock: Clock,
               skip: frozenset[str] = frozenset()) -> dict:
    """Every flood but those in `skip` in its own thread from the start of `during`; each lets go by its end."""
    hold_until = clock.during_ends()
    results: dict[str, dict] = {}
    metrics_before = metrics_page(urls["metrics"])

    def routes() -> dict:
        result, sent = floods.bogus_routes(urls["grpc"], records, sizes.bogus_routes, hold_until)
        page = metrics_page(urls["metrics"])
        leaked = [r for r in sent if r in page]
        return {**result, "metrics_bytes_before": len(metrics_before), "metrics_bytes_after": len(page),
                "leaked_labels": len(leaked)}

    jobs = {
        "idle_streams": lambda: floods.idle_streams(urls["grpc"], records, sizes.idle_streams, hold_until),
        "idle_gateway_calls": lambda: floods.idle_gateway_calls(urls["gateway"], records, sizes.idle_gateway_calls,
                                                                hold_until),
        "big_records": lambda: floods.big_records(urls["gateway"], records, sizes.big_record_callers,
                                                  sizes.big_records_per_call, hold_until),
        "llm_disconnects": lambda: floods.llm_disconnects(urls["http"], sizes.llm_disconnects, hold_until),
        "bogus_routes": routes,
        "oversized_bodies": lambda: floods.oversized_bodies(urls["http"], sizes.oversized_bodies,
                                                            sizes.oversized_body_bytes, hold_until),
        "grpc_deadlines": lambda: careless_callers.grpc_deadlines(urls["grpc"], records, sizes.grpc_deadline_calls,
                                                                  GIVING_UP_CALLERS, hold_until,
                                                                  sizes.grpc_deadline_rate),
        "cancelled_streams": lambda: careless_callers.cancelled_streams(urls["grpc"], records, sizes.cancelled_streams,
                                                                        STREAM_CANCELLERS, hold_until),
        "invalid_records": lambda: careless_callers.invalid_records(urls["http"], urls["grpc"], records,
                                                                    sizes.invalid_record_requests, CARELESS_CALLERS,
                                                                    hold_until),
        "malformed_bytes": lambda: careless_callers.malformed_bytes(urls["http"], records,
                                                                    sizes.malformed_bytes_requests, CARELESS_CALLERS,
                                                                    hold_until),
        "bytes_classification": lambda: wire_attacks.bytes_classification(
            urls["http"], urls["grpc"], records, sizes.bytes_classification_requests, CARELESS_CALLERS, hold_until),
        "damaged_streams": lambda: wire_attacks.damaged_streams(urls["grpc"], records, sizes.damaged_streams,
                                                                CARELESS_CALLERS, hold_until, WIRE_SEED),
        "overlong_varints": lambda: wire_attacks.overlong_varints(urls["grpc"], records,
                                                                  sizes.overlong_varint_requests, CARELESS_CALLERS,
                                                                  hold_until, WIRE_SEED),
        "greedy_client": lambda: wire_attacks.greedy_client(urls["grpc"], records, sizes.greedy_held_calls,
                                                            sizes.greedy_silent_streams, hold_until),
    }
    unknown = set(skip) - set(FLOOD_NAMES)
    if unknown:
        raise ValueError(f"no flood named {', '.join(sorted(unknown))}; the floods are {', '.join(FLOOD_NAMES)}")
    jobs = {name: job for name, job in jobs.items() if name not in skip}

    def run(name: str, job: Callable[[], dict]) -> None:
        try:
            results[name] = job()
        except Exception as err:  # noqa: BLE001 - a flood client that broke is reported, the soak goes on
            results[name] = {"sent": 0, "outcomes": {f"flood client failed: {type(err).__name__}: {err}"[:200]: 1},
                             "unanswered": 0}

    threads = [threading.Thread(target=run, args=item, name=f"flood-{item[0]}", daemon=True)
               for item in jobs.items()]
    for thread in threads:
        thread.start()
    probes = floods.api_probes(urls["http"], urls["grpc"])
    results["api_probes"] = {"sent": len(probes), "outcomes": {
        f"{p['probe']}: {'refused' if p['refused'] else 'reached'} ({p['status']})": 1 for p in probes},
        "unanswered": sum(p["unanswered"] for p in probes), "probes": probes}
    for thread in threads:
        # Every flood is over by the end of `during`; a request of one may still be waited for, within its timeout.
        thread.join(max(0.0, hold_until - time.monotonic()) + floods.REQUEST_TIMEOUT_S + 5)
    for name in jobs:
        results.setdefault(name, {"sent": 0, "outcomes": {"still running after its time": 1}, "unanswered": 1})
    return {name: results[name] for name in (*jobs, "api_probes")}
