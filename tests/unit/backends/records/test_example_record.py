"""Records in tf.Example form, serialized by TensorFlow itself, decoded without TensorFlow like JSON records."""
import json

import numpy as np
import pytest

from s2t.backends.records.example_record import as_example
from s2t.backends.records.feature_spec import INTEGER, CategoricalFeature, FeatureSpec
from s2t.backends.records.record_decoder import RecordDecoder, RecordError, parse_record
from s2t.clients.legacy_record import to_protobuf
from s2t.gate import example_parity
from tests.samples import tf_example
from s2t.wire import skill_pb2


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


def test_an_empty_tf_example_feature_where_one_value_is_expected_is_that_records_error():
    # An empty list is a sparse feature's "no value"; a feature of one value refuses it when decoded.
    import tensorflow as tf
    feature = {"purpose": tf.train.Feature(bytes_list=tf.train.BytesList(value=[])),
               "amount": tf.train.Feature(float_list=tf.train.FloatList(value=[10.0]))}
    payload = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    decoded = RecordDecoder(INTEGER_SPEC).decode([payload])
    assert str(decoded.errors[0]) == "features.purpose: expected a string, got no value (an empty tf.Example feature)"


def test_several_values_for_a_feature_of_one_value_are_that_records_error(feature_spec, german_credit_data):
    record = german_credit_data.records()[0]
    name = feature_spec.categorical[0].name
    payload = example_parity.serialize_example({**record, name: [record[name], record[name]]})
    decoded = RecordDecoder(feature_spec).decode([tf_example(record), payload])
    assert decoded.errors[0] is None and str(decoded.errors[1]) == f"features.{name}: expected a string, got array"


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


INTEGER_SPEC = FeatureSpec((CategoricalFeature("branch", {}, 0, INTEGER), CategoricalFeature("purpose", {"car": 0}, 1)),
                           ("amount",), {"branch": -1})


def _json(features) -> bytes:
    return json.dumps({"features": features}).encode()


@pytest.mark.parametrize("features, branch", [
    ({"branch": 2 ** 40 + 7}, 2 ** 40 + 7),  # beyond float32's exact integers: carried as it is
    ({"branch": -(2 ** 63)}, -(2 ** 63)),
    ({"branch": 2 ** 63 - 1}, 2 ** 63 - 1),
    ({}, -1),  # the parse default
])
def test_an_int64_feature_travels_as_the_integer_itself(features, branch):
    record = {"purpose": "car", "amount": 1.5, **features}
    decoded = RecordDecoder(INTEGER_SPEC).decode([_json(record), example_parity.serialize_example(record)])
    assert decoded.errors == (None, None)
    assert decoded.categorical.tolist() == [[branch, 0], [branch, 0]]


@pytest.mark.parametrize("branch, reason", [
    (2.0, "expected an integer, got number"),
    ("7", "expected an integer, got string"),
    (True, "expected an integer, got boolean"),
    (None, "missing"),
    (2 ** 63, "outside the int64 range"),
    (-(2 ** 63) - 1, "outside the int64 range"),
])
def test_an_int64_feature_that_is_no_int64_is_refused_for_that_record_alone(branch, reason):
    good = {"purpose": "car", "amount": 1.5, "branch": 3}
    decoded = RecordDecoder(INTEGER_SPEC).decode([_json(good), _json({**good, "branch": branch}), _json(good)])
    assert decoded.errors[0] is None and decoded.errors[2] is None
    assert decoded.errors[1].field == "features.branch" and reason in decoded.errors[1].reason
    assert decoded.categorical[[0, 2]].tolist() == [[3, 0], [3, 0]]


def test_a_float_sent_for_an_int64_feature_of_a_tf_example_is_refused_naming_it():
    payload = example_parity.serialize_example({"purpose": "car", "amount": 1.5, "branch": 3.0})
    assert str(RecordDecoder(INTEGER_SPEC).decode([payload]).errors[0]) == \
        "features.branch: expected an integer, got number"


@pytest.mark.parametrize("spec", [INTEGER_SPEC, FeatureSpec((CategoricalFeature("p", {"a": 1}, 0),), ("x",))])
def test_a_spec_with_integer_features_reads_back_as_written(spec):
    assert FeatureSpec.from_json(spec.to_json()) == spec
    assert ('"kind"' in spec.to_json()) == any(f.kind == INTEGER for f in spec.categorical)


def test_a_spec_with_an_unknown_feature_kind_is_refused():
    text = INTEGER_SPEC.to_json().replace('"integer"', '"bitmap"')
    with pytest.raises(ValueError, match="unknown categorical feature kind 'bitmap'"):
        FeatureSpec.from_json(text)


SEVERAL = FeatureSpec((CategoricalFeature("purposes/0", {"car": 0}, 1), CategoricalFeature("purposes/1", {"car": 0}, 1),
                       CategoricalFeature("codes/0", {}, 0, INTEGER), CategoricalFeature("codes/1", {}, 0, INTEGER)),
                      ("history/0", "history/1", "history/2", "age"),
                      {"history/0": 1.0, "history/1": 2.0, "history/2": 3.0},
                      {"purposes": 2, "codes": 2, "history": 3})


@pytest.mark.parametrize("features, categorical, numeric", [
    ({"purposes": ["car", "boat"], "codes": [2 ** 40, -1], "history": [4.0, 5.0, 6.5], "age": 30},
     [0, 1, 2 ** 40, -1], [4.0, 5.0, 6.5, 30.0]),
    ({"purposes": ["boat", "car"], "codes": [0, 0], "age": 30}, [1, 0, 0, 0], [1.0, 2.0, 3.0, 30.0]),  # default
])
def test_a_feature_of_several_values_spreads_over_its_columns_in_every_form(features, categorical, numeric):
    payloads = [_json(features), example_parity.serialize_example(features)]
    decoded = RecordDecoder(SEVERAL).decode(payloads)
    assert decoded.errors == (None, None)
    assert decoded.categorical.tolist() == [categorical] * 2 and decoded.numeric.tolist() == [numeric] * 2


@pytest.mark.parametrize("change, field, reason", [
    ({"history": [1.0, 2.0]}, "features.history", "expected a list of 3 values, got 2"),
    ({"history": 1.0}, "features.history", "expected a list of 3 values, got a number"),
    ({"codes": [1, 2.5]}, "features.codes/1", "expected an integer, got number"),
    ({"purposes": None}, "features.purposes/0", "missing"),
])
def test_a_feature_of_several_values_sent_otherwise_is_that_records_error(change, field, reason):
    good = {"purposes": ["car", "car"], "codes": [1, 2], "history": [4.0, 5.0, 6.0], "age": 30}
    bad = {k: v for k, v in {**good, **change}.items() if v is not None}
    decoded = RecordDecoder(SEVERAL).decode([_json(good), _json(bad), _json(good)])
    assert decoded.errors[0] is None and decoded.errors[2] is None
    assert decoded.errors[1].field == field and reason in decoded.errors[1].reason


def test_a_spec_with_features_of_several_values_reads_back_as_written():
    assert FeatureSpec.from_json(SEVERAL.to_json()) == SEVERAL
    assert SEVERAL.keys == ("purposes", "codes", "history", "age")
