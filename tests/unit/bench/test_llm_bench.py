import sys
import time

import pytest

from s2t.clients.llm_client import StreamResult
from s2t import triton_config
from s2t.bench.harness import latency
from s2t.bench.scenarios import llm
from s2t.bench.scenarios.llm import _engine_parameters, _llm_repository, _summary
from tests.conftest import LLM_REPOSITORY


@pytest.mark.parametrize("values, q, expected", [
    ([], 95, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0), (list(range(101)), 95, 95),
    ([1.0, 2.0], 95, 1.95),
])
def test_the_figures_take_the_benchs_one_percentile_and_none_when_nothing_was_timed(values, q, expected):
    found = latency.percentile_or_none(values, q)
    assert found == (None if expected is None else pytest.approx(expected))
    if values:
        assert found == latency.percentile(values, q)


def test_the_bench_repository_copy_switches_the_batching_policy_and_nothing_else(tmp_path):
    copy = _llm_repository(LLM_REPOSITORY, tmp_path, "fifo")
    original, edited = triton_config.load(LLM_REPOSITORY / "llm"), triton_config.load(copy / "llm")
    assert original.parameters["batching_policy"].string_value == "length_aware"
    assert edited.parameters["batching_policy"].string_value == "fifo"
    edited.parameters["batching_policy"].string_value = "length_aware"
    assert edited == original
    assert sorted(p.name for p in copy.iterdir()) == ["llm"]
    assert sorted(p.name for p in (copy / "llm").iterdir()) == sorted(
        p.name for p in (LLM_REPOSITORY / "llm").iterdir() if p.name != "__pycache__")


def test_llama_alone_gets_the_engine_settings_of_the_config(tmp_path):
    engine = _engine_parameters(LLM_REPOSITORY)
    parameters = triton_config.load(LLM_REPOSITORY / "llm").parameters
    assert engine == {key: int(parameters[key].string_value)
                      for key in ("threads", "slots", "context_per_slot", "prompt_cache_mib", "prompt_step_tokens")}


class _Child(llm.LlamaAlone):
    """LlamaAlone's handling of its child, with a child that needs no model: `script` in place of llama.cpp."""

    def __init__(self, script: str):
        super().__init__({})
        self.script = script

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script]


# Its address, then far more than a pipe holds, then a mark that it got past it, then serving until stdin closes.
CHATTY = ("import sys\nprint('http://127.0.0.1:9', flush=True)\n"
          "for _ in range(20000):\n    print('x' * 100)\nsys.stdout.flush()\n"
          "open(sys.argv[1], 'w').close()\nsys.stdin.read()\n")


def test_llama_alone_keeps_reading_a_chatty_child_and_stops_it(tmp_path):
    mark = tmp_path / "past the output"
    child = _Child(CHATTY)
    child.command = lambda: [sys.executable, "-c", CHATTY, str(mark)]
    with child:
        assert child.base_url == "http://127.0.0.1:9/v1"
        deadline = time.monotonic() + 20
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists() and child.process.poll() is None  # never blocked on a full pipe; serving
    assert child.process.returncode is not None


def test_llama_alone_gives_up_on_a_child_that_says_nothing_within_its_deadline(monkeypatch):
    monkeypatch.setattr(llm, "LLAMA_START_S", 0.5)
    child = _Child("import time\ntime.sleep(60)\n")
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start"):
        child.__enter__()
    assert time.monotonic() - began < 30 and child.process.returncode is not None


def test_the_summary_counts_tokens_ttft_and_gaps_from_the_event_times():
    result = StreamResult(started=0.0, events=[(0.5, {"text_output": "a"}), (0.52, {"text_output": "b"}),
                                               (0.56, {"text_output": "c"}),
                                               (0.57, {"text_output": "", "output_tokens": 3})])
    summary = _summary([result, StreamResult(started=0.0, error="text_input: empty prompt")], wall_s=1.0)
    assert summary["errors"] == 1 and summary["output_tokens"] == 3 and summary["tokens_per_s"] == 3.0
    assert summary["ttft_p50_s"] == 0.5
    assert summary["itl_p95_s"] == pytest.approx(latency.percentile([0.02, 0.04], 95))  # the two gaps between the three tokens


def test_both_sides_are_sent_the_same_numbered_prompts_in_every_plan():
    # Greedy answers follow the prompt, its number included: one counter per side, numbered before any is sent.
    sides = {side: llm._Numbered() for side in llm.SIDES}
    sent = {side: [numbered("Say hello.")] + [p for stream in llm._closed_loop_prompts(4, 3, numbered) for p in stream]
            for side, numbered in sides.items()}
    first, second = (sent[side] for side in llm.SIDES)
    assert first == second and len(set(first)) == len(first) == 13
    assert llm._closed_loop_prompts(2, 2, llm._Numbered(), ("a", "b", "c")) == [["(1) a", "(2) b"], ["(3) b", "(4) c"]]
