"""Records in tf.Example form through the live risk_pipeline, mixed with JSON and SkillRecord ones."""
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from s2t.clients.legacy_record import to_protobuf
from tests.samples import tf_example

TOLERANCE = 1e-5


def test_tf_examples_json_and_skill_records_in_one_request_score_as_the_legacy_model(grpc_client, german_credit_data,
                                                                                     legacy_scores):
    records = german_credit_data.records()[:240]
    payloads = [[tf_example(r), json.dumps({"features": r}).encode(),
                 to_protobuf({"request_id": f"r-{i}", "features": r}).SerializeToString()][i % 3]
                for i, r in enumerate(records)]
    tensor = grpcclient.InferInput("payload", [len(payloads), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(payloads, dtype=object).reshape(-1, 1))
    result = grpc_client.infer("risk_pipeline", [tensor], client_timeout=60)
    served = result.as_numpy("probability").ravel()
    assert np.abs(served - legacy_scores[:240]).max() <= TOLERANCE


def test_a_bad_tf_example_fails_with_the_feature_named(grpc_client, german_credit_data):
    record = dict(german_credit_data.records()[0])
    del record["purpose"]
    tensor = grpcclient.InferInput("payload", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[tf_example(record)]], dtype=object))
    with pytest.raises(InferenceServerException, match="features.purpose: missing"):
        grpc_client.infer("risk_pipeline", [tensor], client_timeout=60)
