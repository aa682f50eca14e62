"""`s2t bench --mode llm`'s run on its quick plan against the real tritonserver and llama.cpp model: every part
measured, and its progress heard step by step up to the whole."""
import json

from tests.conftest import DATA_CSV, ENSEMBLES, LLM_REPOSITORY, MODEL_REPOSITORY
from s2t.bench.load import genai_perf
from s2t.bench.scenarios import llm
from tests.integration.bench_load import assert_load_follows_the_rule


def test_llm_bench_measures_both_policies_and_risk_pipeline_and_reports_every_step(built_artifacts, tmp_path):
    heard = []
    results = llm.run(tmp_path, [MODEL_REPOSITORY, ENSEMBLES], LLM_REPOSITORY, DATA_CSV, log=lambda line: None,
                      quick=True, on_progress=lambda done, total, label: heard.append((done, total, label)))
    assert [p["concurrency"] for p in results["concurrency"]] == list(llm.CONCURRENCY)
    assert all(p["tokens_per_s"] > 0 for p in results["concurrency"])
    assert set(results["mixed"]) == {"length_aware", "fifo"}
    assert results["risk_beside_llm"]["alone"]["throughput"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["mixed"] == results["mixed"]
    # genai-perf profiled `llm` in both conventions, its token counts from the GGUF file's own tokenizer.
    assert [p["backend"] for p in results["genai_perf"]] == list(genai_perf.BACKENDS)
    for point in results["genai_perf"]:
        assert point["output_tokens_per_s"] > 0 and point["ttft_p50_ms"] > 0 and point["requests"] == 4
        assert point["output_sequence_length"] == point["max_tokens"]
    assert "genai-perf (kserve" in (tmp_path / "results.md").read_text()
    # The acceptance comparison: both sides at every point, each answered every request and counted its CPU per
    # token by process; every acceptance line judged, and the verdict printed.
    comparison = results["openai_vs_llama"]
    assert list(comparison["points"]) == list(llm.OPENAI_POINTS)
    for point in comparison["points"].values():
        assert set(point) == set(llm.SIDES)
        for side in point.values():
            assert side["errors"] == 0, side["first_error"]
            assert side["output_tokens"] > 0 and side["ttft_p50_s"] > 0 and side["cpu_us_per_token_total"] > 0
        assert set(point["s2t"]["cpu_us_per_token"]) == {"OpenAI API", "tritonserver", "stubs (llm)"}
    assert [line["line"].split(":")[0] for line in comparison["acceptance"]] == [
        "c=1", "c=1", "c=4", "c=4", "burst of 16 mixed-length streams"]
    assert comparison["accepted"] == all(line["met"] for line in comparison["acceptance"])
    assert "acceptance line" in (tmp_path / "results.md").read_text()
    openai_rounds = [f"openai {point} {side}" for point in llm.OPENAI_POINTS for side in ("llama.cpp", "s2t")]
    assert_load_follows_the_rule(results, [*openai_rounds, *(f"llm c={c}" for c in llm.CONCURRENCY), "mixed prompts, length_aware",
                                           "mixed prompts, fifo", "risk_pipeline beside the LLM"],
                                 (tmp_path / "results.md").read_text())
    assert [label for _, _, label in heard] == [
        "length_aware: tritonserver starting", "openai vs llama.cpp: servers starting",
        *(f"openai vs llama.cpp: {point}" for point in llm.OPENAI_POINTS), "length_aware: llm c=1", "length_aware: llm c=2",
        "length_aware: llm c=4", "genai-perf --backend tensorrtllm", "genai-perf --backend vllm",
        "length_aware: mixed prompts", "fifo: tritonserver starting", "fifo: mixed prompts",
        "risk_pipeline alone", "risk_pipeline beside 4 LLM streams", f"results in {tmp_path}"]
    assert [(done, total) for done, total, _ in heard] == [(n, llm.STEPS) for n in range(llm.STEPS + 1)]
