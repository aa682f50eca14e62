"""`s2t drift`: the training data's distributions (the reference risk_router compares live records with), and
the live PSI per feature and of the score, read from the metrics port."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from backends.atomic_files import write_atomically
from backends.drift import Reference
from backends.record_decoder import encode_columns
from s2t.gate.canary_analysis import parse_metrics, scrape

PSI_METRIC = "s2t_feature_psi"
ALERT_PSI = 0.2


def build_reference(data_csv: Path, onnx_model: Path, out: Path) -> Reference:
    """Encode the training data as the adapter does, score it with the model, count both over the drift bins."""
    import onnx
    import onnxruntime as ort

    from s2t.models import german_credit
    from s2t.models.convert import read_spec

    spec = read_spec(onnx.load(str(onnx_model), load_external_data=False))
    categorical, numeric = encode_columns(spec, german_credit.load(data_csv).columns)
    session = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"])
    scores = session.run(["probability"], {"categorical": categorical, "numeric": numeric})[0]
    reference = Reference.build(spec, categorical, numeric, np.asarray(scores))
    write_atomically(out, reference.to_json() + "\n")
    return reference


def live_psi(metrics_text_or_url: str) -> dict[str, float]:
    metrics = (parse_metrics(metrics_text_or_url) if "\n" in metrics_text_or_url
               else scrape(metrics_text_or_url))
    return {dict(labels)["feature"]: value for (name, labels), value in metrics.items() if name == PSI_METRIC}


def table(values: dict[str, float]) -> str:
    if not values:
        return "no s2t_feature_psi metrics: risk_router has no drift reference, or has seen no records yet"
    width = max(len(name) for name in values)
    lines = [f"{'feature':<{width}}  PSI"]
    for name, value in sorted(values.items(), key=lambda kv: (-kv[1] if not math.isnan(kv[1]) else 1, kv[0])):
        flag = "  DRIFT (> 0.2)" if value > ALERT_PSI else ""
        lines.append(f"{name:<{width}}  {'n/a' if math.isnan(value) else f'{value:.3f}'}{flag}")
    return "\n".join(lines)
