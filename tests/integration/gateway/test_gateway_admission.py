"""`s2t gateway` call slots against the real server, with valid callers beside greedy or hostile ones: silent calls
cannot hold the slots, oversized records are refused at the edge with the gateway's memory flat, and callers at
exactly `--workers` concurrency are never refused."""
import threading
import time
from concurrent import futures

import grpc
import pytest

from tests.conftest import free_port
from tests.integration.skill_services import running, skill_records
from s2t.wire import skill_pb2, skill_pb2_grpc

WORKERS = 8
MIB = 2**20


@pytest.fixture(scope="module")
def gateway(triton):
    port = free_port()
    with running(["gateway", "--port", str(port), "--grpc-url", triton.grpc_url, "--window-size", "32",
                  "--workers", str(WORKERS)], "ready") as process:
        yield port, process
        assert process.poll() is None, "the gateway died"


def silent_after(first: skill_pb2.SkillRecord, release: threading.Event):
    yield first
    release.wait(30)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _outcome(call) -> tuple:
    try:
        return "OK", len(call.result(timeout=30).results)
    except grpc.RpcError as err:
        return err.code().name, err.details()


def _silent_calls_and_a_valid_caller(gateway, german_credit_data) -> list:
    """Eight silent calls, then valid calls until one is answered; the silent calls' outcomes once released."""
    port, _ = gateway
    release = threading.Event()
    record = skill_records(german_credit_data, [0])[0]
    # Each silent call on a channel of its own, as eight separate clients would hold them.
    channels = [grpc.insecure_channel(f"localhost:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(WORKERS)]
    try:
        silent = [skill_pb2_grpc.SkillStub(c).Score.future(silent_after(record, release), timeout=30)
                  for c in channels]
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            # Valid calls until one takes a silent call's slot (that call ends): before every silent call is
            # admitted a valid one finds a free slot, before they have been silent for 0.5 s it is told to retry.
            # Polled, not slept, because how soon the silent calls are admitted depends on the machine's load.
            first, waited, deadline = None, 0.0, time.monotonic() + 30
            while not any(call.done() for call in silent):
                assert time.monotonic() < deadline, "no silent call gave up its slot within 30 s"
                started = time.monotonic()
                try:
                    first = stub.Score(iter(skill_records(german_credit_data, range(3))), timeout=10)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    time.sleep(0.1)
                    continue
                waited = time.monotonic() - started
            if any(call.done() and call.exception() is not None
                   and call.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED for call in silent):
                release.set()
                return [_outcome(call) for call in silent]
            later = [stub.Score(iter(skill_records(german_credit_data, range(3, 6))), timeout=10) for _ in range(3)]
        # Served within a second by design; 3 s leaves room for a loaded (shared, 2-core) test machine while
        # still far below the 5 s idle limit a silent call would otherwise hold its slot for.
        assert first is not None and waited < 3.0, f"the valid caller waited {waited:.2f} s"
        for answer in [first, *later]:
            assert [r.status for r in answer.results] == [skill_pb2.OK] * 3
        release.set()
        outcomes = [_outcome(call) for call in silent]
    finally:
        release.set()
        for channel in channels:
            channel.close()
    return outcomes


def test_eight_silent_calls_holding_every_slot_leave_a_valid_caller_answered_within_a_second(gateway,
                                                                                             german_credit_data):
    # The premise is every slot held by a silent call. A valid call that arrives before the eighth silent call is
    # admitted takes the free slot, and that silent call is refused at once: the scenario is then set up again.
    for _ in range(3):
        outcomes = _silent_calls_and_a_valid_caller(gateway, german_credit_data)
        if not any(code == "RESOURCE_EXHAUSTED" for code, _ in outcomes):
            break
    else:
        raise AssertionError(f"a silent call was refused at admission in every attempt: {outcomes}")
    # The first valid call took the slot of one silent call (the others found it free again); a silent call that
    # outlived the gateway's idle limit on a slow machine is ended too, and the rest are answered once they close.
    reclaimed = [details for code, details in outcomes if code == "UNAVAILABLE"]
    assert len(reclaimed) >= 1 and all("without a record" in details for details in reclaimed), outcomes
    for code, details in outcomes:
        assert (code, details) == ("OK", 1) or code == "UNAVAILABLE" or \
            (code == "DEADLINE_EXCEEDED" and "no record for 5 s" in details), outcomes


def trickle(record: skill_pb2.SkillRecord, stop: threading.Event):
    """A record every 0.1 s: a call that is working, so never reclaimed for silence."""
    for _ in range(100):
        yield record
        if stop.wait(0.1):
            return


def refused_once_full(stub, data, within_s: float = 30.0) -> grpc.RpcError:
    """Calls until one is refused (every slot taken by then): how soon the held calls are all admitted depends on
    the machine's load. A call made before that is answered and leaves its slot at once."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            stub.Score(iter(skill_records(data, range(3))), timeout=10)
        except grpc.RpcError as err:
            return err
        time.sleep(0.05)
    raise AssertionError(f"no call refused within {within_s} s")


def test_callers_that_go_away_mid_call_free_their_slots_at_once(gateway, german_credit_data):
    port, _ = gateway
    stop = threading.Event()
    record = skill_records(german_credit_data, [0])[0]
    channels = [grpc.insecure_channel(f"localhost:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(WORKERS)]
    try:
        working = [skill_pb2_grpc.SkillStub(c).Score.future(trickle(record, stop), timeout=30) for c in channels]
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            full = refused_once_full(stub, german_credit_data)
            for call in working:
                call.cancel()
            started = time.monotonic()
            answer = None
            while answer is None and time.monotonic() - started < 5:
                try:
                    answer = stub.Score(iter(skill_records(german_credit_data, range(3))), timeout=10)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                    time.sleep(0.05)
            freed_after = time.monotonic() - started
    finally:
        stop.set()
        for channel in channels:
            channel.close()
    assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert answer is not None and [r.status for r in answer.results] == [skill_pb2.OK] * 3
    # Freed at once by design; 3 s is the margin for a loaded test machine (the 5 s idle limit would be slower).
    assert freed_after < 3.0, f"slots of cancelled calls were held {freed_after:.2f} s"


def test_callers_at_exactly_the_workers_each_calling_again_at_once_are_never_refused(gateway, german_credit_data):
    port, _ = gateway
    records = skill_records(german_credit_data, range(64))
    # The race is rare (a few calls in a thousand refused when a slot was counted until the call was fully done):
    # enough calls to see it, bounded in time.
    calls_each, deadline = 250, time.monotonic() + 60

    def caller(offset: int) -> list:
        refused = []
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            for i in range(calls_each):
                if time.monotonic() > deadline:
                    break
                batch = records[(offset + i) % 32:][:32]
                try:
                    answer = stub.Score(iter(batch), timeout=30)
                except grpc.RpcError as err:
                    refused.append(f"{err.code().name}: {err.details()}")
                    continue
                assert [r.request_id for r in answer.results] == [r.request_id for r in batch]
                assert all(r.status == skill_pb2.OK for r in answer.results)
        return refused

    with futures.ThreadPoolExecutor(WORKERS) as pool:
        refused = [reason for reasons in pool.map(caller, range(WORKERS)) for reason in reasons]
    assert refused == []


def test_records_of_a_mebibyte_are_refused_at_the_edge_and_the_gateways_memory_stays_flat(gateway,
                                                                                         german_credit_data):
    port, process = gateway
    valid = skill_records(german_credit_data, range(32))

    def greedy(caller: int) -> list:
        """Three calls, each streaming up to 40 records with a 1 MiB string: about 480 MiB offered in all."""
        outcomes = []
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            for call in range(3):
                def huge():
                    for i in range(40):
                        record = skill_pb2.SkillRecord()
                        record.CopyFrom(valid[i % 32])
                        record.features["purpose"].string_value = "x" * MIB
                        yield record
                try:
                    answer = stub.Score(huge(), timeout=60)
                    outcomes.append(("OK", {r.status for r in answer.results}))
                except grpc.RpcError as err:
                    outcomes.append((err.code().name, err.details()))
        return outcomes

    def steady() -> list:
        answers = []
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            for _ in range(10):
                answers.append(stub.Score(iter(valid), timeout=60))
        return answers

    before = rss_bytes(process.pid)
    with futures.ThreadPoolExecutor(5) as pool:
        greedy_calls = [pool.submit(greedy, caller) for caller in range(4)]
        valid_calls = pool.submit(steady)
        outcomes = [outcome for call in greedy_calls for outcome in call.result(timeout=300)]
        answers = valid_calls.result(timeout=300)
    growth = rss_bytes(process.pid) - before
    assert growth < 150 * MIB, f"gateway RSS grew {growth / MIB:.0f} MiB"
    assert len(outcomes) == 12
    for code, details in outcomes:
        assert code == "RESOURCE_EXHAUSTED" and "larger than max" in details, (code, details)
    for answer in answers:
        assert [r.status for r in answer.results] == [skill_pb2.OK] * 32


def test_a_connection_gets_its_share_of_slots_and_its_silent_calls_end_at_the_idle_limit(triton, german_credit_data):
    port, release = free_port(), threading.Event()
    record = skill_records(german_credit_data, [0])[0]
    with running(["gateway", "--port", str(port), "--grpc-url", triton.grpc_url, "--workers", "4",
                  "--max-calls-per-caller", "2", "--idle-timeout-s", "1"], "ready"), \
            grpc.insecure_channel(f"localhost:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as greedy, \
            grpc.insecure_channel(f"localhost:{port}") as polite:
        started = time.monotonic()
        held = [skill_pb2_grpc.SkillStub(greedy).Score.future(silent_after(record, release), timeout=30)
                for _ in range(2)]
        over_share = refused_once_full(skill_pb2_grpc.SkillStub(greedy), german_credit_data)
        answer = skill_pb2_grpc.SkillStub(polite).Score(iter(skill_records(german_credit_data, range(3))), timeout=10)
        ended = []
        for call in held:
            with pytest.raises(grpc.RpcError) as err:
                call.result(timeout=30)
            ended.append(err.value)
        took = time.monotonic() - started
        release.set()
    assert over_share.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "already has 2 calls in progress" in over_share.details()
    assert [r.status for r in answer.results] == [skill_pb2.OK] * 3
    assert all(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "no record for 1 s" in e.details() for e in ended)
    assert 1.0 <= took < 10
