"""Load generators, the field's own tools driven as functions: wrk, h2load, perf_analyzer, genai-perf (with its offline tokenizer), Model Analyzer, and locust's locustfile."""
