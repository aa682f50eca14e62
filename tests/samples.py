"""Small specs, records and models that several test modules share."""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper

from s2t.backends.records.feature_spec import CategoricalFeature, FeatureSpec

SPEC = FeatureSpec(
    categorical=(CategoricalFeature("housing", {"own": 1, "rent": 2, "for free": 3}, 0),
                 CategoricalFeature("telephone", {"none": 1, "yes": 2}, 0)),
    numeric=("age_in_years", "credit_amount"),
)
VALID = {"housing": "rent", "telephone": "yes", "age_in_years": 35, "credit_amount": 1234.5}


def tf_example(features: dict) -> bytes:
    import tensorflow as tf
    feature = {}
    for name, value in features.items():
        if isinstance(value, str):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif isinstance(value, int):
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


SHIFT = 0.05


def shifted_model(source: Path, out: Path, shift: float) -> Path:
    """The same model with `shift` added to its probability (clipped to [0, 1]): a candidate that scores differently."""
    model = onnx.load(str(source))
    graph = model.graph
    producer = next(n for n in graph.node if "probability" in n.output)
    producer.output[list(producer.output).index("probability")] = "probability_unshifted"
    graph.initializer.extend([helper.make_tensor("shift", onnx.TensorProto.FLOAT, [], [shift]),
                              helper.make_tensor("zero", onnx.TensorProto.FLOAT, [], [0.0]),
                              helper.make_tensor("one", onnx.TensorProto.FLOAT, [], [1.0])])
    graph.node.extend([helper.make_node("Add", ["probability_unshifted", "shift"], ["probability_shifted"]),
                       helper.make_node("Clip", ["probability_shifted", "zero", "one"], ["probability"])])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(out))
    return out
