"""Legacy records: their types, the decoder (JSON, protobuf, tf.Example), the feature spec and TensorFlow's string
hashes."""
