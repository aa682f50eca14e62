"""Records in tf.Example form, serialized by TensorFlow itself, decoded without TensorFlow like JSON records."""
import json

import numpy as np
import pytest

from backends.example_record import as_example
from backends.record_decoder import RecordDecoder, RecordError, parse_record
from clients.legacy_record import to_protobuf
from tests.samples import tf_example
from wire import skill_pb2


def test_german_credit_as_tf_examples_decodes_exactly_as_the_json_records(feature_spec, german_credit_data):
    records = german_credit_data.records()[:200]
    decoder = RecordDecoder(feature_spec)
    from_json = decoder.decode([json.dumps({"features": r}).encode() for r in records])
    from_examples = decoder.decode([tf_example(r) for r in records])
    assert from_examples.errors == (None,) * 200
    np.testing.assert_array_equal(from_examples.categorical, from_json.categorical)
    np.testing.assert_array_equal(from_examples.numeric, from_json.numeric)


def test_json_skill_record_and_tf_example_mix_in_one_batch(feature_spec, german_credit_data):
    record = german_credit_data.records()[0]
    batch = [json.dumps({"features": record}).encode(), to_protobuf({"request_id": "r", "features": record})
             .SerializeToString(), tf_example(record)]
    decoded = RecordDecoder(feature_spec).decode(batch)
    assert decoded.errors == (None,) * 3
    assert (decoded.categorical == decoded.categorical[0]).all() and (decoded.numeric == decoded.numeric[0]).all()


@pytest.mark.parametrize("features, field, reason", [
    ({"purpose": ["a", "b"]}, "features.purpose", "holds one value, got 2"),
    ({"purpose": []}, "features.purpose", "holds one value, got 0"),
])
def test_a_tf_example_feature_that_is_not_one_value_is_that_records_error(features, field, reason):
    import tensorflow as tf
    feature = {n: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() for v in vs]))
               for n, vs in features.items()}
    payload = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    with pytest.raises(RecordError) as err:
        parse_record(payload)
    assert err.value.field == field and reason in err.value.reason


def test_non_utf8_bytes_in_a_tf_example_name_the_feature():
    import tensorflow as tf
    feature = {"purpose": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff\xfe"]))}
    payload = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    with pytest.raises(RecordError, match="features.purpose: not UTF-8"):
        parse_record(payload)


@pytest.mark.parametrize("request_id", ["r-1", "", "\u2603" * 10, "x" * 256])
def test_a_skill_record_without_features_is_never_taken_for_a_tf_example(request_id, feature_spec):
    payload = skill_pb2.SkillRecord(request_id=request_id).SerializeToString() or b"\x0a\x00"
    assert as_example(payload) is None
    decoded = RecordDecoder(feature_spec).decode([payload])
    assert decoded.errors[0] is not None and decoded.errors[0].field.startswith("features")
