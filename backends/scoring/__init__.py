"""Scoring: ONNX Runtime behind a config, the fused pipeline, batch scoring, the decision and the reason codes."""
