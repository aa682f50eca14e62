"""How a generation stream notices that its client has gone while it waits: asked every sweep, probed with an empty
text_output when it has had no token for PROBE_AFTER_S (an HTTP client's departure shows only on a failed send)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from s2t.backends.runtime.decoupled_sender import StreamSender
from s2t.backends.llm.stream_timing import LlmMetrics
from s2t.backends.llm.generation_request import GenerationRequest
from s2t.backends.llm.token_stream import (CANCEL_POLL_S, CLIENT_CHECK_S, FIRST_PROBE_AFTER_S, PROBE_AFTER_S, TICK_S,
                                          YOUNG_S, GenerationStream, LiveStreams)
from tests.unit import python_backend as backend
from tests.unit.fake_clock import Clock


@pytest.fixture
def clock():
    return Clock()


def stream_of(clock, client_gone, stream=True, live=None):
    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    generation = GenerationRequest("Say hi.", max_tokens=4, stream=stream)
    made = GenerationStream(generation, 5, StreamSender(sender, pb), outbox=None,
                            metrics=LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}, clock),
                            client_cancelled=lambda: client_gone[0], tensor=pb.Tensor,
                            clock=clock, live=live)
    return made, sender


def texts(sender) -> list[str]:
    return [r.output("text_output")[0].decode() for r, _ in sender.sent]


def test_a_waiting_stream_is_probed_with_empty_text_once_per_interval(clock):
    made, sender = stream_of(clock, [False])
    made.check_client()
    assert sender.sent == []
    clock.now += PROBE_AFTER_S
    made.check_client()
    made.check_client()
    assert texts(sender) == [""]
    clock.now += PROBE_AFTER_S
    made.check_client()
    assert texts(sender) == ["", ""] and not made.cancelled.is_set()


def test_a_stream_whose_client_left_is_cancelled_and_not_probed(clock):
    gone = [False]
    made, sender = stream_of(clock, gone)
    gone[0] = True
    clock.now += PROBE_AFTER_S
    made.check_client()
    assert made.cancelled.is_set() and made.job().is_cancelled() and sender.sent == []


@pytest.mark.parametrize("streaming, first_token", [(False, False), (True, True)])
def test_no_probe_for_a_single_response_request_or_once_tokens_flow(clock, streaming, first_token):
    made, sender = stream_of(clock, [False], stream=streaming)
    if first_token:
        made.timing.token(clock.now)
    clock.now += 10 * PROBE_AFTER_S
    made.check_client()
    assert sender.sent == []


def test_the_sweep_checks_every_live_stream_and_forgets_finished_ones(clock):
    live = LiveStreams()
    gone = [False]
    streams = [stream_of(clock, gone, live=live)[0] for _ in range(3)]
    for made in streams:
        live.add(made)
    live.discard(streams[0])
    gone[0] = True
    live.sweep()
    assert len(live) == 2
    assert [s.cancelled.is_set() for s in streams] == [False, True, True]
    assert np.all([s.job().is_cancelled() for s in streams[1:]])


def test_a_waiting_stream_is_first_probed_soon_after_it_comes_then_once_per_interval(clock):
    # Triton's HTTP endpoint sees a gone client only once the request has had a response: the first probe comes
    # early, so an abandoned request leaves the queue about when its client does.
    made, sender = stream_of(clock, [False])
    clock.now += FIRST_PROBE_AFTER_S / 2
    made.check_client()
    assert sender.sent == []
    clock.now += FIRST_PROBE_AFTER_S / 2
    made.check_client()
    assert texts(sender) == [""]
    clock.now += PROBE_AFTER_S / 2
    made.check_client()
    assert texts(sender) == [""]
    clock.now += PROBE_AFTER_S / 2
    made.check_client()
    assert texts(sender) == ["", ""]


def test_each_tick_checks_the_young_waiting_streams_and_a_sweep_all_and_a_gone_client_wakes_the_engine(clock):
    wakes, asked = [], []
    live = LiveStreams(on_cancel=lambda: wakes.append(clock.now), clock=clock)

    def watched(name, gone):
        made = stream_of(clock, gone, live=live)[0]
        client_cancelled = made.client_cancelled
        made.client_cancelled = lambda: asked.append(name) or client_cancelled()
        live.add(made)
        return made

    old = watched("old", [False])
    clock.now += YOUNG_S
    gone = [False]
    young = watched("young", gone)
    streaming = watched("streaming", [False])
    streaming.timing.token(clock.now)
    live.tick()  # a whole sweep is due: the first since the old stream came
    assert sorted(asked) == ["old", "streaming", "young"]
    asked.clear()
    clock.now += TICK_S
    live.tick()
    assert asked == ["young"] and wakes == []
    gone[0] = True
    clock.now += TICK_S
    live.tick()
    assert young.cancelled.is_set() and len(wakes) == 1
    asked.clear()
    clock.now += CANCEL_POLL_S
    live.tick()
    assert sorted(asked) == ["old", "streaming"] and len(wakes) == 1, "a cancelled stream is not asked about again"
    assert not old.cancelled.is_set() and not streaming.cancelled.is_set()


def test_a_submitted_stream_is_live_until_it_finishes_and_one_the_engine_refuses_is_not_kept(clock):
    from s2t.backends.llm.engine import QueueFull

    live, jobs = LiveStreams(), []
    accepted, refused = (stream_of(clock, [False], live=live)[0] for _ in range(2))
    live.submit(accepted, jobs.append)

    def full(job):
        raise QueueFull("the admission queue is full")

    with pytest.raises(QueueFull):
        live.submit(refused, full)
    assert len(live) == 1 and [job.request for job in jobs] == [accepted.generation]


class InlineOutbox:
    """Runs each task at once, on the caller's thread (the outbox's order without its thread)."""

    def put(self, task):
        task()

    run_or_put = put


@pytest.mark.parametrize("gap_s, tokens, asks", [
    # A token every 12 ms: the client is asked on the first token and then once per CLIENT_CHECK_S, not per token.
    (0.012, 20, 4),
    # Tokens further apart than CLIENT_CHECK_S: asked on each.
    (0.06, 5, 5),
])
def test_while_tokens_flow_the_client_is_asked_about_once_per_interval_not_per_token(clock, gap_s, tokens, asks):
    calls = []
    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    made = GenerationStream(GenerationRequest("Say hi.", max_tokens=tokens, stream=True), 5, StreamSender(sender, pb),
                            outbox=InlineOutbox(),
                            metrics=LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}, clock),
                            client_cancelled=lambda: calls.append(clock.now) or False, tensor=pb.Tensor, clock=clock)
    job = made.job()
    for n in range(tokens):
        job.on_token(f"t{n}")
        clock.now += gap_s
    assert texts(sender) == [f"t{n}" for n in range(tokens)]
    assert len(calls) == asks
    assert all(b - a >= CLIENT_CHECK_S - 1e-9 for a, b in zip(calls, calls[1:]))


def test_a_client_that_leaves_while_tokens_flow_stops_its_generation_within_the_interval(clock):
    gone = [False]
    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    made = GenerationStream(GenerationRequest("Say hi.", max_tokens=64, stream=True), 5, StreamSender(sender, pb),
                            outbox=InlineOutbox(),
                            metrics=LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}, clock),
                            client_cancelled=lambda: gone[0], tensor=pb.Tensor, clock=clock)
    job = made.job()
    job.on_token("a")
    gone[0] = True
    left_at = clock.now
    while not job.is_cancelled():
        clock.now += 0.012
        job.on_token("b")
        assert clock.now - left_at <= CLIENT_CHECK_S + 0.012


class DeferredOutbox:
    """Holds the tasks until `run` (an outbox busy with other streams)."""

    def __init__(self):
        self.tasks = []

    def put(self, task):
        self.tasks.append(task)

    run_or_put = put

    def run(self):
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task()


def test_tokens_that_pile_up_behind_a_busy_outbox_go_in_one_response_and_every_token_is_counted(clock):
    from s2t.backends.llm.engine import Completion

    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    outbox = DeferredOutbox()
    metrics = LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}, clock)
    made = GenerationStream(GenerationRequest("Say hi.", max_tokens=8, stream=True), 5, StreamSender(sender, pb),
                            outbox=outbox, metrics=metrics, client_cancelled=lambda: False, tensor=pb.Tensor,
                            clock=clock)
    job = made.job()
    job.on_token("a")
    outbox.run()
    for piece in ("b", "c", "d"):
        clock.now += 0.01
        job.on_token(piece)
    assert len(outbox.tasks) == 1  # one delivery queued for the three
    clock.now += 0.01
    job.on_token("e")
    job.on_finish(Completion(5, 5, "length"))
    outbox.run()
    assert texts(sender) == ["a", "bcde", ""]  # the final response of a stream repeats no text
    assert metrics._tokens.value() == 5
    assert metrics._itl.observed == pytest.approx([0.01] * 4)
    assert len(metrics._ttft.observed) == 1


def test_metrics_kept_for_a_stream_reach_triton_in_batches_and_at_its_end(clock):
    from s2t.backends.llm.engine import Completion
    from s2t.backends.llm.token_stream import METRICS_BATCH_TOKENS

    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    metrics = LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}, clock)
    made = GenerationStream(GenerationRequest("Say hi.", max_tokens=100, stream=False), 5,
                            StreamSender(sender, pb), outbox=InlineOutbox(), metrics=metrics,
                            client_cancelled=lambda: False, tensor=pb.Tensor, clock=clock)
    job = made.job()
    for n in range(METRICS_BATCH_TOKENS + 3):
        job.on_token("x")
        clock.now += 0.01
    assert metrics._tokens.value() == METRICS_BATCH_TOKENS
    job.on_finish(Completion(5, METRICS_BATCH_TOKENS + 3, "length"))
    assert metrics._tokens.value() == METRICS_BATCH_TOKENS + 3
    assert len(metrics._itl.observed) == METRICS_BATCH_TOKENS + 2
    assert texts(sender) == ["x" * (METRICS_BATCH_TOKENS + 3)]


def test_ticks_are_handed_over_one_at_a_time_until_stopped():
    live, stopping, handed = LiveStreams(), threading.Event(), []
    runner = threading.Thread(target=live.run_ticks, args=(handed.append, stopping, 0.005))
    runner.start()
    time.sleep(0.1)
    assert len(handed) == 1  # not run yet: no second one is handed over
    handed[0]()
    time.sleep(0.1)
    stopping.set()
    runner.join(2)
    assert len(handed) == 2 and not runner.is_alive()
