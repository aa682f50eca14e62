"""A token is sent from the engine's own thread when the outbox is idle (no hand-over to the outbox's thread per
token), queued behind the outbox's work otherwise; either way no two tasks talk to Triton at once and a stream's
responses keep their order."""
from __future__ import annotations

import threading
import time

from s2t.backends.runtime.decoupled_sender import Outbox, StreamSender
from s2t.backends.llm.engine import Completion
from s2t.backends.llm.generation_request import GenerationRequest
from s2t.backends.llm.stream_timing import LlmMetrics
from s2t.backends.llm.token_stream import GenerationStream
from tests.unit import python_backend as backend


def outbox() -> Outbox:
    errors = []
    box = Outbox(errors.append, "test-outbox")
    box.errors = errors
    return box


def test_an_idle_outbox_runs_the_task_on_the_callers_thread():
    box = outbox()
    ran_on = []
    box.run_or_put(lambda: ran_on.append(threading.current_thread()))
    box.close()
    assert ran_on == [threading.current_thread()] and box.errors == []


def test_a_busy_outbox_queues_the_task_behind_the_running_one():
    box = outbox()
    started, release, order = threading.Event(), threading.Event(), []
    box.put(lambda: (started.set(), release.wait(5), order.append("first")))
    assert started.wait(5)
    box.run_or_put(lambda: order.append("second"))
    assert order == []  # not run on this thread while the outbox's thread is sending
    release.set()
    box.close()
    assert order == ["first", "second"]


def test_a_queued_task_runs_before_one_handed_in_after_it():
    box = outbox()
    started, release, order = threading.Event(), threading.Event(), []
    box.put(lambda: (started.set(), release.wait(5)))
    assert started.wait(5)
    box.put(lambda: order.append("queued"))
    release.set()
    box.run_or_put(lambda: order.append("handed in after"))
    box.close()
    assert order == ["queued", "handed in after"]


def test_tasks_never_run_at_once_and_each_threads_tasks_keep_their_order():
    box = outbox()
    running, overlaps, seen = [0], [], {n: [] for n in range(4)}
    lock = threading.Lock()

    def task(n: int, k: int):
        def run():
            with lock:
                running[0] += 1
                if running[0] > 1:
                    overlaps.append((n, k))
            time.sleep(0.0001)
            seen[n].append(k)
            with lock:
                running[0] -= 1
        return run

    def producer(n: int):
        for k in range(300):
            (box.run_or_put if k % 3 else box.put)(task(n, k))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    box.close(timeout=30)
    assert overlaps == [] and box.errors == []
    assert all(seen[n] == list(range(300)) for n in seen)


def test_a_streams_tokens_and_final_response_arrive_in_order_through_a_real_outbox():
    """Tokens from the engine's thread, some while the outbox's thread is busy with other work (a sweep, another
    stream), all in order and before the final response."""
    pb = backend.backend_utils()
    sender = backend.ResponseSender()
    box = outbox()
    stream = GenerationStream(GenerationRequest("Say hi.", max_tokens=200, stream=True), 5,
                              StreamSender(sender, pb), box,
                              LlmMetrics(pb.MetricFamily, {"model": "llm", "version": "1"}),
                              client_cancelled=lambda: False, tensor=pb.Tensor)
    job = stream.job()
    for k in range(200):
        if k % 20 == 0:
            box.put(lambda: time.sleep(0.002))  # the outbox's thread busy for a while
        job.on_token(f"t{k} ")
    job.on_finish(Completion(5, 200, "length"))
    box.close(timeout=30)
    texts = [r.output("text_output")[0].decode() for r, _ in sender.sent]
    assert "".join(texts[:-1]) == "".join(f"t{k} " for k in range(200))
    assert sender.sent[-1][1] == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL and box.errors == []
