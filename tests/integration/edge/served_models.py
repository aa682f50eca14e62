"""What the fuzz suites aim at: the served models' signatures, read from their configs, and valid records."""
from __future__ import annotations

import json
from pathlib import Path

from s2t import triton_config
from s2t.gate.hostile_requests import Model, Tensor, kserve_datatype
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY

# The public models a caller scores with: the pipeline, its scorer, the router and the ensemble.
FUZZED_MODELS = (MODEL_REPOSITORY / "risk_pipeline", MODEL_REPOSITORY / "risk_scorer",
                 MODEL_REPOSITORY / "risk_router", ENSEMBLES / "risk_pipeline_ensemble")


def served_model(model_dir: Path) -> Model:
    config = triton_config.load(model_dir)

    def tensors(entries) -> tuple[Tensor, ...]:
        return tuple(Tensor(t.name, kserve_datatype(t.data_type), t.dims)
                     for t in triton_config.tensors(entries).values())
    return Model(config.name, tensors(config.input), tensors(config.output), config.max_batch_size)


def fuzzed_models() -> tuple[Model, ...]:
    return tuple(served_model(path) for path in FUZZED_MODELS)


def valid_records(german_credit_data, count: int = 64) -> list[bytes]:
    return [json.dumps({"request_id": f"r-{i}", "features": r}).encode()
            for i, r in enumerate(german_credit_data.records()[:count])]
