"""Integration tests: the risk models served by the real tritonserver (risk_pipeline, risk_router, risk_stream, risk_explainer): answers, bad input, crashes."""
