"""risk_explainer's parameters: where its reason model is, what it calls, when it degrades to the template."""
from __future__ import annotations

from dataclasses import dataclass

from backends.model_parameters import parameter, positive_integer
from backends.record_decoder import max_record_bytes_parameter


@dataclass(frozen=True)
class ExplainerSettings:
    reason_model: str = parameter("reason_model", "reason_model.onnx")  # relative to the version folder
    top_reasons: int = parameter("top_reasons", 3, parse=positive_integer)
    max_record_bytes: int = max_record_bytes_parameter()
    scoring_model: str = parameter("scoring_model", "risk_pipeline")
    llm_model: str = parameter("llm_model", "llm")
    max_tokens: int = parameter("max_tokens", 48, parse=positive_integer)
    degrade_ttft_s: float = parameter("degrade_ttft_s", 1.0)
    probe_interval_s: float = parameter("probe_interval_s", 5.0)
    workers: int = parameter("workers", 4, parse=positive_integer)
