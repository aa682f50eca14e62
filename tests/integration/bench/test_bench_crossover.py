"""The crossover bench on a short plan (two widths, one round of one second each) against the real tritonserver and
FastAPI app: every point measured on both sides without errors, and its progress counted step by step."""
import json

from tests.conftest import MODEL_REPOSITORY
from s2t.bench.scenarios import crossover
from s2t.bench.harness.machine_load import markdown_lines
from tests.integration.bench_load import assert_load_follows_the_rule


def test_crossover_measures_each_width_on_both_sides_and_reports_every_step(built_artifacts, tmp_path):
    heard = []
    results = crossover.run(tmp_path, MODEL_REPOSITORY, built_artifacts["onnx"], built_artifacts["data"], seconds=1.0,
                            rounds=1, widths=(0, 256), log=lambda line: None,
                            on_progress=lambda done, total, label: heard.append((done, total, label)))
    assert [p["width"] for p in results["points"]] == [0, 256]
    for point in results["points"]:
        for side in ("triton", "fastapi"):
            assert point[side]["throughput"] > 0 and point[side]["errors"] == 0, (point["width"], side)
    written = json.loads((tmp_path / "crossover.json").read_text())
    assert written["points"] == results["points"] and written["load"] == results["load"]
    # Each measured wrk round watched for the machine's load; the verdict is what the CLI prints first.
    assert_load_follows_the_rule(results, [f"width {w}: wrk {side} round 1" for w in (0, 256)
                                           for side in ("triton", "fastapi")], "\n".join(markdown_lines(results["load"])))
    # Per width the servers' start and one wrk round per side: 6 steps, each heard as it starts, then the whole.
    assert heard == [(0, 6, "width 0: servers starting"), (1, 6, "width 0: wrk triton round 1"),
                     (2, 6, "width 0: wrk fastapi round 1"), (3, 6, "width 256: servers starting"),
                     (4, 6, "width 256: wrk triton round 1"), (5, 6, "width 256: wrk fastapi round 1"),
                     (6, 6, f"results in {tmp_path}")]
