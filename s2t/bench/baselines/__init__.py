"""What Triton is measured against: plain FastAPI + ONNX Runtime, and the in-process limit."""
