"""Building and converting: the legacy model, its conversion to ONNX (tf.Example signatures included), TensorRT engines."""
