"""Small specs, records and models that several test modules share."""
from __future__ import annotations

from s2t.backends.records.feature_spec import CategoricalFeature, FeatureSpec
# A candidate that scores differently (the benchmark's rollback stage publishes the same one).
from s2t.bench.scenarios.rollback_under_load import SHIFT, shifted_model  # noqa: F401

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
