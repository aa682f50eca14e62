import pytest

from s2t.clients.llm_client import StreamResult
from s2t.bench.scenarios.llm import _llm_repository, _summary, percentile
from tests.conftest import LLM_REPOSITORY


@pytest.mark.parametrize("values, q, expected", [
    ([], 95, None), ([3.0], 95, 3.0), ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0), (list(range(101)), 95, 95),
])
def test_percentile_takes_the_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


def test_the_bench_repository_copy_switches_the_batching_policy_and_nothing_else(tmp_path):
    copy = _llm_repository(LLM_REPOSITORY, tmp_path, "fifo")
    original = (LLM_REPOSITORY / "llm" / "config.pbtxt").read_text()
    edited = (copy / "llm" / "config.pbtxt").read_text()
    assert edited == original.replace('string_value: "length_aware"', 'string_value: "fifo"') != original
    assert not (copy / "risk_explainer").exists()


def test_the_summary_counts_tokens_ttft_and_gaps_from_the_event_times():
    result = StreamResult(started=0.0, events=[(0.5, {"text_output": "a"}), (0.52, {"text_output": "b"}),
                                               (0.56, {"text_output": "c"}),
                                               (0.57, {"text_output": "", "output_tokens": 3})])
    summary = _summary([result, StreamResult(started=0.0, error="text_input: empty prompt")], wall_s=1.0)
    assert summary["errors"] == 1 and summary["output_tokens"] == 3 and summary["tokens_per_s"] == 3.0
    assert summary["ttft_p50_s"] == 0.5
    assert summary["itl_p95_s"] == pytest.approx(0.04)
