"""Overload: past the queue cap a request is refused at once with a clear error; the rest are answered."""
import json
import re
import shutil

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from s2t import triton_config
from tests.integration.servers import triton_server


@pytest.fixture(scope="module")
def small_queue_server(built_artifacts, tmp_path_factory):
    """The router's interactive queue cut to 2 requests, so that a burst overflows it on this machine, and its bulk
    queue's timeout raised from 5 s to 120 s: 48 x 256 records are about 4 s of work here when the machine is idle and
    more under load, and the bulk test is about the queue's size, not its timeout. The config, not the request, is
    where to lengthen it: Triton takes a caller's timeout override only when it is shorter than the policy's."""
    root = tmp_path_factory.mktemp("overload")
    repo = root / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    config = repo / "risk_router" / "config.pbtxt"
    text, count = re.subn(r"max_queue_size: 512", "max_queue_size: 2", config.read_text(), count=1)
    assert count == 1, "risk_router's config no longer has the queue cap this test lowers"
    text, count = re.subn(r"default_timeout_microseconds: 5000000", "default_timeout_microseconds: 120000000", text)
    assert count == 1, "risk_router's config no longer has the bulk queue timeout this test raises"
    config.write_text(text)
    server = triton_server([repo, ENSEMBLES], log_path=root / "triton.log")
    with server:
        yield server


def burst(server, payload, count, priority=0, model="risk_router", queue_timeout_us=None):
    """`count` concurrent requests; `queue_timeout_us` shortens the queue policy's timeout for each of them."""
    client = http.InferenceServerClient(server.http_url, concurrency=count, network_timeout=120)
    tensor = http.InferInput("payload", list(payload.shape), "BYTES")
    tensor.set_data_from_numpy(payload)
    pending = [client.async_infer(model, [tensor], priority=priority, timeout=queue_timeout_us)
               for _ in range(count)]
    answers = []
    for request in pending:
        try:
            answers.append(request.get_result())
        except InferenceServerException as err:
            answers.append(err)
    client.close()
    return answers


def bursts_until(server, payload, refused_with: str, **burst_args) -> list:
    """Bursts of 48 (at most 10) until one has a request refused with `refused_with`; every answer of every burst.
    Whether a burst stands deep in the queue depends on how fast the client sends against how fast the router
    drains: on a loaded machine a burst can trickle in and be served whole."""
    answers = []
    for _ in range(10):
        answers += burst(server, payload, 48, **burst_args)
        if any(isinstance(a, InferenceServerException) and refused_with in a.message() for a in answers):
            break
    return answers


def test_the_router_rejects_late_interactive_requests_and_caps_both_queues():
    batching = triton_config.load(MODEL_REPOSITORY / "risk_router").dynamic_batching
    policy = batching.default_queue_policy
    assert batching.priority_levels == 2 and batching.default_priority_level == 1
    assert policy.timeout_action == policy.REJECT and policy.default_timeout_microseconds == 1_000_000
    assert 0 < policy.max_queue_size and 0 < batching.priority_queue_policy[2].max_queue_size


@pytest.mark.parametrize("model", ["risk_pipeline", "skill_adapter", "risk_scorer"])
def test_the_hot_path_models_carry_no_queue_policy(model):
    """A queue policy makes Triton 2.51's batcher hold requests about 500 ms (the configs say where measured)."""
    batching = triton_config.load(MODEL_REPOSITORY / model).dynamic_batching
    assert batching.priority_levels == 0 and not batching.HasField("default_queue_policy")


def test_burst_past_the_queue_cap_is_refused_clearly_and_the_rest_are_scored(small_queue_server,
                                                                            german_credit_data):
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:256]]
    answers = bursts_until(small_queue_server, np.array(records, dtype=object).reshape(-1, 1),
                           "Exceeds maximum queue size")
    refused = [a for a in answers if isinstance(a, InferenceServerException)]
    scored = [a for a in answers if not isinstance(a, InferenceServerException)]
    assert refused, "10 bursts of 48 concurrent requests of 256 records never overflowed a queue of 2"
    # Both refusals of the policy: the queue was full, or the request waited past its timeout.
    assert all(re.search("Exceeds maximum queue size|Request timeout expired", e.message()) for e in refused), \
        {e.message() for e in refused}
    assert any("Exceeds maximum queue size" in e.message() for e in refused)
    assert scored and all(a.as_numpy("probability").shape == (256, 1) for a in scored)
    client = http.InferenceServerClient(small_queue_server.http_url)
    assert client.is_server_ready() and client.is_model_ready("risk_pipeline")
    client.close()


def test_bulk_priority_has_its_own_larger_queue(small_queue_server, german_credit_data):
    # The same burst that overflows the interactive queue of 2 (the test above) fits the bulk queue whole.
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:256]]
    answers = burst(small_queue_server, np.array(records, dtype=object).reshape(-1, 1), 48, priority=2)
    refused = {a.message() for a in answers if isinstance(a, InferenceServerException)}
    assert not refused, refused
    assert all(a.as_numpy("probability").shape == (256, 1) for a in answers)


def test_a_caller_may_shorten_its_wait_in_the_bulk_queue(small_queue_server, german_credit_data):
    # A 1 ms timeout: a request that finds the router free is scored, one queued behind another past 1 ms is refused.
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:256]]
    answers = bursts_until(small_queue_server, np.array(records, dtype=object).reshape(-1, 1),
                           "Request timeout expired", priority=2, queue_timeout_us=1_000)
    refused = {a.message() for a in answers if isinstance(a, InferenceServerException)}
    assert refused == {"Request timeout expired"}, refused
    assert all(a.as_numpy("probability").shape == (256, 1) for a in answers
               if not isinstance(a, InferenceServerException))


def test_rate_limited_server_serves_the_pipeline_within_its_slots(built_artifacts, german_credit_data, tmp_path):
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], rate_limit_slots=1,
                           log_path=tmp_path / "triton.log")
    with server:
        records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:32]]
        answers = burst(server, np.array(records, dtype=object).reshape(-1, 1), 8, model="risk_pipeline")
        assert all(a.as_numpy("probability").shape == (32, 1) for a in answers)
    log = (tmp_path / "triton.log").read_text()
    assert re.search(r"rate_limit\s+\|\s+EXEC_COUNT", log)
    assert '"name":"cpu_slot", "count":1' in log
