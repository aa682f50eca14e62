"""The ceiling: a model with risk_pipeline's inputs, outputs, batching and backend that does no work.

`add(repository)` writes `risk_pipeline_ceiling` beside risk_pipeline in a copy of the repository (the benchmark's,
never the one users serve): risk_pipeline's own config, renamed and without its parameters, and a model.py that
answers every record with a constant probability and decision, reading none of them. What risk_pipeline reaches
against it under the same load on the same server is the share of the serving machinery's ceiling that decoding,
scoring and deciding leave: the rest is Triton's front end, its batcher and the in-process backend.
"""
from __future__ import annotations

from pathlib import Path

from s2t.bench.harness.repository import edited
from s2t.wire.names import PIPELINE

CEILING = f"{PIPELINE}_ceiling"

MODEL_PY = '''"""risk_pipeline_ceiling: risk_pipeline's inputs and outputs, no work (the benchmark's ceiling)."""
import numpy as np

from s2t.backends.runtime.triton_glue import Rows
from s2t.wire.names import PAYLOAD


class InProcessModel:
    INPUTS = (PAYLOAD,)

    def __init__(self, model):
        pass

    def execute(self, payloads):
        rows = len(payloads)
        return Rows({"probability": np.zeros((rows, 1), np.float32),
                     "decision": np.full((rows, 1), b"APPROVE", dtype=object)})
'''


def add(repository: Path) -> Path:
    """The ceiling model's folder, written into `repository` (which holds risk_pipeline)."""
    def change(config) -> None:
        config.name = CEILING
        config.ClearField("parameters")

    folder = repository / CEILING
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(edited((repository / PIPELINE / "config.pbtxt").read_text(), change))
    (folder / "1" / "model.py").write_text(MODEL_PY)
    return folder
