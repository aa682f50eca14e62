"""`s2t gateway` never cancels a call it has sent to Triton. Triton 2.51's gRPC frontend can crash the whole server on
a cancelled ModelInfer (a race between its two handler threads); before the gateway left its calls to finish, six
callers whose windows held a record that is no SkillRecord took tritonserver down (SIGSEGV) within 2 s, every run.

The server here logs verbosely, so every cancellation notification Triton receives is counted: the gateway must
cause none, whether it refuses a call or its caller goes away mid-window, while valid callers beside them are
scored as the legacy model scores them, and none when the gateway stops."""
import random
import threading
import time
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
from tests.integration.servers import serving, triton_server
from tests.integration.skill_services import running, skill_records
from s2t.wire import skill_pb2, skill_pb2_grpc

TOLERANCE = 1e-5
WINDOW = 32
HOSTILE_CALLERS, CALLS_EACH = 6, 100
CANCELLED = "Cancellation notification received for ModelInferHandler"


@pytest.fixture(scope="module")
def verbose_triton(built_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("triton_verbose") / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log_path=log, extra_args=["--log-verbose=1"])
    with serving(server):
        yield server


@pytest.fixture(scope="module")
def gateway_port(verbose_triton):
    port = free_port()
    with running(["gateway", "--port", str(port), "--grpc-url", verbose_triton.grpc_url, "--window-size",
                  str(WINDOW)], "ready") as process:
        yield port
        assert process.poll() is None, "the gateway died"
    # Stopped (SIGTERM) right after the callers: its calls to Triton still running were let finish, not cut.
    assert cancellations(verbose_triton) == 0, "the gateway cancelled calls to Triton as it stopped"


def cancellations(server) -> int:
    return server.log_path.read_text(errors="replace").count(CANCELLED)


@contextmanager
def valid_callers_beside(port, data, legacy_scores):
    """Two callers sending 2 windows a call for as long as the `with` lasts: yields (calls answered, problems)."""
    answered, problems = [], []
    rows = list(range(2 * WINDOW))
    records = skill_records(data, rows, prefix="valid")
    stop = threading.Event()

    def call_until_stopped():
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            while not stop.is_set():
                try:
                    answer = stub.Score(iter(records), timeout=60)
                except grpc.RpcError as err:
                    problems.append(f"{err.code().name}: {err.details()}")
                    continue
                scores = [r.probability for r in answer.results]
                if [r.status for r in answer.results] != [skill_pb2.OK] * len(rows) or \
                        max(abs(s - legacy_scores[row]) for s, row in zip(scores, rows)) > TOLERANCE:
                    problems.append(f"wrong answer: {answer.results[:2]}")
                answered.append(1)

    callers = [threading.Thread(target=call_until_stopped) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        yield answered, problems
    finally:
        stop.set()
        for caller in callers:
            caller.join()


def assert_same_triton_ready(server, pid):
    assert server.process.poll() is None and server.process.pid == pid, "tritonserver died"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_model_ready("risk_pipeline")
    finally:
        client.close()


def test_calls_refused_for_a_record_that_is_no_skill_record_cancel_nothing_in_triton(
        verbose_triton, gateway_port, german_credit_data, legacy_scores):
    pid, before = verbose_triton.process.pid, cancellations(verbose_triton)
    window = [r.SerializeToString() for r in skill_records(german_credit_data, range(WINDOW - 1))] + [b"\xff\xff\xff"]

    def hostile(_):
        outcomes = []
        with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
            raw = channel.stream_unary("/skill.Skill/Score", request_serializer=None, response_deserializer=None)
            for _ in range(CALLS_EACH):
                try:
                    raw(iter(window), timeout=60)
                    outcomes.append("answered")
                except grpc.RpcError as err:
                    outcomes.append(f"{err.code().name} {'is not a skill.SkillRecord' in (err.details() or '')}")
        return outcomes

    with valid_callers_beside(gateway_port, german_credit_data, legacy_scores) as (answered, problems), \
            futures.ThreadPoolExecutor(HOSTILE_CALLERS) as pool:
        outcomes = [o for each in pool.map(hostile, range(HOSTILE_CALLERS)) for o in each]
    assert outcomes == ["INVALID_ARGUMENT True"] * (HOSTILE_CALLERS * CALLS_EACH)
    assert answered and not problems, problems[:3]
    assert_same_triton_ready(verbose_triton, pid)
    assert cancellations(verbose_triton) == before, "the gateway cancelled calls it had sent to Triton"


def test_callers_that_go_away_mid_window_cancel_nothing_in_triton(
        verbose_triton, gateway_port, german_credit_data, legacy_scores):
    pid, before = verbose_triton.process.pid, cancellations(verbose_triton)
    records = skill_records(german_credit_data, range(3 * WINDOW), prefix="leaving")
    rng = random.Random(20261202)
    pauses = [rng.uniform(0.0, 0.02) for _ in range(HOSTILE_CALLERS * CALLS_EACH)]

    def leaving(k):
        left = 0
        with grpc.insecure_channel(f"localhost:{gateway_port}") as channel:
            stub = skill_pb2_grpc.SkillStub(channel)
            for pause in pauses[k::HOSTILE_CALLERS]:
                call = stub.Score.future(iter(records), timeout=60)
                time.sleep(pause)
                left += call.cancel()
        return left

    with valid_callers_beside(gateway_port, german_credit_data, legacy_scores) as (answered, problems), \
            futures.ThreadPoolExecutor(HOSTILE_CALLERS) as pool:
        left = sum(pool.map(leaving, range(HOSTILE_CALLERS)))
    assert left > CALLS_EACH, f"only {left} calls went away before their answer: the test proves nothing"
    assert answered and not problems, problems[:3]
    assert_same_triton_ready(verbose_triton, pid)
    assert cancellations(verbose_triton) == before, "the gateway cancelled calls it had sent to Triton"
