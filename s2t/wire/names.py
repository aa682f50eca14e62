"""The names on the wire between callers and Triton: the served models and their tensors. Code and tests use these
instead of spelling the strings again."""

# Models
PIPELINE = "risk_pipeline"
ROUTER = "risk_router"
SCORER = "risk_scorer"
SCORER_LITE = "risk_scorer_lite"
DECISION_MODEL = "risk_decision"
ADAPTER = "skill_adapter"
STREAM = "risk_stream"

# Tensors
PAYLOAD = "payload"  # BYTES [rows, 1]: one legacy record per row (JSON, SkillRecord or tf.Example)
CATEGORICAL = "categorical"  # INT64 [rows, 13]: vocabulary indices, the scorer's first input
NUMERIC = "numeric"  # FP32 [rows, 7]: the scorer's second input
PROBABILITY = "probability"  # FP32 [rows, 1]
DECISION = "decision"  # BYTES [rows, 1]: APPROVE / REVIEW / DECLINE
SERVED_BY = "served_by"  # BYTES [rows, 1]: model:version that scored the row (risk_router)
