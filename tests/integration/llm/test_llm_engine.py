"""The engine on the real llama.cpp model, without Triton: prompts counted on one kept connection, and the admission
hold following llama.cpp's own timings of the prompts it evaluated."""
import threading

import pytest

from s2t.backends.llm.batching import BatchingSettings
from s2t.backends.llm.engine import EngineSettings, Job, LlmEngine
from s2t.backends.llm.generation_request import GenerationRequest

LONG = "Summarise this loan file in one line: " + "The applicant has repaid every previous loan on time. " * 10


@pytest.fixture(scope="module")
def engine():
    made = LlmEngine(EngineSettings(slots=4, context_per_slot=512), BatchingSettings())
    yield made
    made.stop()


def generate(engine, prompt, max_tokens=3):
    done, tokens = threading.Event(), []
    finished = []
    job = Job(GenerationRequest(prompt, max_tokens=max_tokens, stream=True), engine.count_tokens(prompt),
              tokens.append, lambda completion: (finished.append(completion), done.set()), lambda: False)
    engine.submit(job)
    assert done.wait(60)
    return tokens, finished[0]


def test_prompts_are_counted_on_one_kept_connection_and_again_after_it_closes(engine):
    counts = [engine.count_tokens(LONG) for _ in range(5)]
    connection = engine._local.connection
    assert len(set(counts)) == 1 and counts[0] > 100
    assert engine.count_tokens("Hi.") < 10 and engine._local.connection is connection
    connection.sock.close()  # the listener's side gone: the next count reconnects once
    assert engine.count_tokens(LONG) == counts[0]
    # Counted from other threads at once: each its own connection, the same answers.
    results = []
    threads = [threading.Thread(target=lambda: results.append(engine.count_tokens(LONG))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [counts[0]] * 4


def test_the_hold_follows_llama_cpps_measured_prompt_evaluation(engine):
    queue = engine._queue
    assert queue.rate.ms_per_token is None
    assert queue.hold_per_token_ms() == BatchingSettings().hold_per_prompt_token_ms
    tokens, completion = generate(engine, LONG + " (first)")
    assert tokens and completion.error is None
    measured = queue.rate.ms_per_token
    assert measured is not None and 0.01 < measured < 1000
    assert queue.hold_per_token_ms() == pytest.approx(BatchingSettings().hold_fraction * measured)


@pytest.fixture
def stepped_engine():
    made = LlmEngine(EngineSettings(slots=2, context_per_slot=512, prompt_step_tokens=32), BatchingSettings())
    yield made
    made.stop()


def test_a_request_whose_client_left_stops_during_its_prompts_evaluation_before_any_token(stepped_engine):
    """Cancelled once it holds a slot: llama.cpp's report of each step of the prompt's evaluation asks whether to go
    on, so the request ends without evaluating its prompt to the end or making a token (a long prompt abandoned in
    a slot would otherwise hold the shared batch for its whole evaluation). Steps of 32 tokens here, so that the
    prompt takes several."""
    engine = stepped_engine
    done, tokens, finished = threading.Event(), [], []
    job = None

    def in_a_slot() -> bool:
        return id(job) in engine._active

    prompt = "Abandoned before its answer. " + LONG  # a head of its own: no slot holds a prefix of it
    job = Job(GenerationRequest(prompt, max_tokens=32, stream=True), engine.count_tokens(prompt),
              tokens.append, lambda completion: (finished.append(completion), done.set()), in_a_slot)
    engine.submit(job)
    assert done.wait(60)
    assert finished[0].finish_reason == "cancelled" and finished[0].completion_tokens == 0 and tokens == []
    # Its prompt was not evaluated: the same prompt again finds none of it in any slot's cache (a prompt evaluated
    # to its end stays in its slot, and llama.cpp gives the next request the slot that holds most of it).
    again = engine._server.handle_chat_completions(
        {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0})
    assert again["timings"]["cache_n"] < job.prompt_tokens / 2 < again["timings"]["prompt_n"], again["timings"]
    # The slot is free again: the next request is answered.
    more, completion = generate(engine, "Say yes.")
    assert more and completion.error is None
