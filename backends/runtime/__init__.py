"""The glue to Triton's python backend and to the in-process backend, and what every model shares: settings, errors,
batching rows, BYTES tensors, fault points, the repository layout, and the Python-based ONNX Runtime backend
(onnxruntime/model.py)."""
