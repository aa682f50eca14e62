"""`s2t gateway` frees what a call made when the call ends. Objects that form reference cycles outlive their call
until a garbage collection of their generation; those that reach the oldest generation wait for a full collection,
minutes apart under steady load, and the gateway's memory grows between collections and falls at each one.

Here the gateway serves in this process, in front of the real Triton, with the garbage collector off; callers in
another process make every kind of call at once (valid, a bad record, a message that is no record, too many
records, a caller that gives up, a caller that goes silent). Then one collection shows what was left to it. grpc.aio
itself leaves a small cycle per call (its handler lookup), so the same callers' calls to a bare grpc.aio server are
the baseline: the gateway may leave nothing beyond it."""
import collections
import gc
import json
import pickle
import subprocess
import sys
import time
import types
from pathlib import Path

import grpc
import pytest

from s2t.gateway.skill_gateway import CallLimits, GatewayServer, serve
from tests.conftest import ROOT, free_port
from tests.integration.skill_services import skill_records

WINDOW = 32
MAX_RECORDS = 200
IDLE_TIMEOUT_S = 0.5
CALLS_EACH = 12

# Each kind of caller on its own thread, all at once; prints how each call ended, per kind.
CALLERS = r"""
import collections, json, pickle, sys, threading, time
import grpc
from s2t.wire import skill_pb2

port, records_path, kinds = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
calls_each = int(sys.argv[4])
records = pickle.loads(open(records_path, "rb").read())
valid, bad_record = records["valid"], records["bad_record"]
outcomes = {kind: collections.Counter() for kind in kinds}

def silent_after(first, seconds):
    yield first
    time.sleep(seconds)

def call(score, kind):
    if kind in ("valid", "baseline"):
        return score(iter(valid), timeout=30)
    if kind == "bad_record":
        return score(iter(valid[:5] + [bad_record] + valid[5:]), timeout=30)
    if kind == "not_a_record":
        return score(iter(valid[:5] + [b"\x08\x96\x01\xff not a record"] + valid[5:]), timeout=30)
    if kind == "too_many":
        return score(iter(valid * (1 + records["max_records"] // len(valid))), timeout=30)
    if kind == "silent":
        return score(silent_after(valid[0], 5 * records["idle_timeout_s"]), timeout=30)
    if kind == "gives_up":
        release = threading.Event()
        def then_waits():
            yield from valid[:40]
            release.wait(10)
        future = score.future(then_waits(), timeout=30)
        time.sleep(0.3)
        future.cancel()
        release.set()
        return future.exception(timeout=30) if not future.cancelled() else None

def caller(kind):
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        score = channel.stream_unary("/skill.Skill/Score")
        for _ in range(calls_each):
            try:
                reply = call(score, kind)
            except grpc.RpcError as err:
                outcomes[kind][err.code().name] += 1
                continue
            if reply is None:
                outcomes[kind]["CANCELLED"] += 1
            elif kind == "baseline":
                outcomes[kind]["OK"] += 1
            else:
                statuses = [r.status for r in skill_pb2.SkillBatchResult.FromString(reply).results]
                outcomes[kind]["+".join(sorted({skill_pb2.SkillStatus.Name(s) for s in statuses}))] += 1

threads = [threading.Thread(target=caller, args=(kind,)) for kind in kinds]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(outcomes))
"""
KINDS = ("valid", "bad_record", "not_a_record", "too_many", "silent", "gives_up")
EXPECTED = {"valid": "OK", "bad_record": "INVALID_RECORD+OK", "not_a_record": "INVALID_ARGUMENT",
            "too_many": "INVALID_ARGUMENT", "silent": "DEADLINE_EXCEEDED", "gives_up": "CANCELLED"}


@pytest.fixture(scope="module")
def records_file(german_credit_data, tmp_path_factory):
    valid = [r.SerializeToString() for r in skill_records(german_credit_data, range(2 * WINDOW + 6))]
    bad = skill_records(german_credit_data, [0], prefix="bad")[0]
    bad.features.clear()  # a SkillRecord the adapter refuses: no features
    path = tmp_path_factory.mktemp("memory") / "records.pickle"
    path.write_bytes(pickle.dumps({"valid": valid, "bad_record": bad.SerializeToString(), "max_records": MAX_RECORDS,
                                   "idle_timeout_s": IDLE_TIMEOUT_S}))
    return path


def make_calls(port: int, records: Path, kinds, calls_each: int = CALLS_EACH) -> dict:
    done = subprocess.run([sys.executable, "-c", CALLERS, str(port), str(records), ",".join(kinds), str(calls_each)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


COUNTED_MODULES = ("s2t", "grpc", "asyncio", "_asyncio")


def _repository_frame(frame: types.FrameType) -> bool:
    source = Path(frame.f_code.co_filename).resolve()
    return source.is_relative_to(ROOT / "s2t") or source.is_relative_to(ROOT / "backends")


def garbage_of(make, settle_s: float = 1.5) -> tuple[dict, collections.Counter, list[str]]:
    """`make()`'s result, the types of what only the garbage collector frees of what it (and the calls still
    finishing `settle_s` after it) made, and the functions whose frames are among them."""
    gc.collect()
    gc.disable()
    try:
        outcome = make()
        time.sleep(settle_s)  # the calls to Triton that refused calls left running end too
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
        gc.enable()
    # Counted: the gateway's, grpc's and asyncio's own objects and the frames of this repository's code. Plain
    # containers, functions and tracebacks are left out: another thread of this process (a fixture's) may make
    # cycles of those while the collector is off, and a call's cycle always holds one of the counted kinds too.
    kinds = collections.Counter(
        f"frame {o.f_code.co_name}" if isinstance(o, types.FrameType) else f"{type(o).__module__}.{type(o).__qualname__}"
        for o in garbage if (_repository_frame(o) if isinstance(o, types.FrameType)
                             else type(o).__module__.startswith(COUNTED_MODULES)))
    frames = sorted({f"{o.f_code.co_name} ({Path(o.f_code.co_filename).name})" for o in garbage
                     if isinstance(o, types.FrameType)})
    del garbage
    gc.collect()
    return outcome, kinds, frames


def bare_grpc_server(port: int) -> GatewayServer:
    async def drain(requests, context):
        async for _ in requests:
            pass
        return b""

    async def start():
        server = grpc.aio.server()
        handler = grpc.stream_unary_rpc_method_handler(drain)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("skill.Skill", {"Score": handler}),))
        server.add_insecure_port(f"localhost:{port}")
        await server.start()

        async def close():
            pass
        return server, close
    return GatewayServer(start)


@pytest.fixture(scope="module")
def gateway_port(triton):
    port = free_port()
    gateway = serve(port, triton.grpc_url, window_size=WINDOW, host="localhost",
                    limits=CallLimits(max_records=MAX_RECORDS), idle_timeout_s=IDLE_TIMEOUT_S)
    try:
        yield port
    finally:
        assert gateway.stop(1).wait(30), "the gateway did not stop"


def test_no_call_leaves_a_reference_cycle_to_the_garbage_collector(triton, gateway_port, records_file):
    pid = triton.process.pid
    bare_port = free_port()
    bare = bare_grpc_server(bare_port)
    try:
        make_calls(bare_port, records_file, ["baseline"], 2)  # first calls: grpc's one-time objects
        answered, baseline, _ = garbage_of(lambda: make_calls(bare_port, records_file, ["baseline"] * len(KINDS)))
    finally:
        bare.stop(1).wait(30)
    assert answered == {"baseline": {"OK": len(KINDS) * CALLS_EACH}}
    make_calls(gateway_port, records_file, KINDS, 2)  # first calls: caches, the channel to Triton, lazy imports

    outcomes, left, frames = garbage_of(lambda: make_calls(gateway_port, records_file, KINDS))

    assert {kind: dict(counts) for kind, counts in outcomes.items()} == \
        {kind: {EXPECTED[kind]: CALLS_EACH} for kind in KINDS}
    beyond = left - baseline
    assert not beyond, (f"objects the calls left to the garbage collector beyond grpc.aio's own "
                        f"({sum(baseline.values())} for as many calls to a bare server): {beyond.most_common(20)}; "
                        f"frames of {frames}")
    assert triton.process.poll() is None and triton.process.pid == pid, "tritonserver died"

