"""The GPU bench's printed report: the machine-load verdict right under its heading, the heading first."""
from s2t.bench.scenarios.gpu import GpuPoint, markdown
from s2t.bench.harness.machine_load import LoadWatch, RoundLoad


def watched(share: float, load_average: float) -> dict:
    watch = LoadWatch(load_average_1m=load_average, cores=16)
    watch.rounds.append(RoundLoad("onnxruntime CPU", 10.0, 10.0 + share * 10.0 * 16, 10.0, 16))
    return watch.summary()


def test_the_gpu_report_says_under_its_heading_whether_the_run_is_publishable():
    points = [GpuPoint("onnxruntime CPU (1 thread)", 64, False, 100, 1000.0, 0.5, 0.9)]
    quiet = markdown(points, "H200", {}, load=watched(0.01, 0.5)).splitlines()
    busy = markdown(points, "H200", {}, load=watched(0.5, 0.5)).splitlines()
    assert quiet[0] == busy[0] == "# GPU benchmark (H200)"
    assert quiet[2].startswith("**Publishable**")
    assert busy[2].startswith("**NOT PUBLISHABLE") and "onnxruntime CPU: other processes used 50%" in busy[2]
    assert "| onnxruntime CPU (1 thread) | 64 | off | 1,000 |" in "\n".join(quiet)
