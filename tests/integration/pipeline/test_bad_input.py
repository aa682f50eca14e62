"""Bad records get an error for their request alone; batch-mates are scored; the server keeps serving."""
import json

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from s2t.backends.records.record_decoder import encode_columns


def payload_input(payload: bytes):
    tensor = http.InferInput("payload", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
    return tensor


def with_feature(features, name, value):
    return json.dumps({"features": {**features, name: value}}).encode()


@pytest.fixture(scope="module")
def malformed(german_credit_data):
    features = german_credit_data.records()[0]
    missing = {k: v for k, v in features.items() if k != "purpose"}
    return [
        (json.dumps({"features": missing}).encode(), "features.purpose: missing"),
        (with_feature(features, "credit_amount", "1169"), "features.credit_amount: expected a number, got string"),
        (with_feature(features, "age_in_years", float("nan")), "features.age_in_years: not a finite"),
        (b"<record>not json</record>", "payload: not valid JSON"),
        (b"{\"features\": \"\xc3\x28\"}", "payload: not UTF-8 text"),
        (b"", "payload: empty"),
        (with_feature(features, "job", "x" * (1 << 20)), "payload: 10"),
    ]


def test_mixed_burst_answers_each_request_on_its_own(triton, german_credit_data, malformed, legacy_scores):
    records = german_credit_data.records()
    valid = [(i, json.dumps({"request_id": f"v-{i}", "features": records[i]}).encode()) for i in range(60)]
    burst = [("valid", i, p) for i, p in valid] + [("bad", j, p) for j, (p, _) in enumerate(malformed)] * 3
    order = np.random.default_rng(7).permutation(len(burst))
    burst = [burst[k] for k in order]

    # tritonclient's HTTP client is gevent-based: concurrency comes from async_infer, not from threads.
    client = http.InferenceServerClient(triton.http_url, concurrency=16, network_timeout=60)
    try:
        pending = [(kind, index, client.async_infer("risk_pipeline", [payload_input(p)])) for kind, index, p in burst]
        answers = []
        for kind, index, request in pending:
            try:
                answers.append((kind, index, request.get_result()))
            except InferenceServerException as err:
                answers.append((kind, index, err))
    finally:
        client.close()

    legacy = legacy_scores
    for kind, index, answer in answers:
        if kind == "valid":
            assert not isinstance(answer, Exception), f"valid record {index} failed: {answer}"
            assert abs(answer.as_numpy("probability")[0, 0] - legacy[index]) <= 1e-5
        else:
            assert isinstance(answer, InferenceServerException), f"malformed record {index} was scored"
            assert malformed[index][1] in answer.message(), answer.message()
    assert triton.process.poll() is None


def test_server_stays_ready_after_malformed_input(triton, malformed, http_client):
    for payload, _ in malformed:
        with pytest.raises(InferenceServerException):
            http_client.infer("risk_pipeline", [payload_input(payload)])
    assert http_client.is_server_ready()
    for model in ("skill_adapter", "risk_scorer", "risk_decision", "risk_pipeline"):
        assert http_client.is_model_ready(model)


def test_request_with_several_records_names_the_bad_record(http_client, german_credit_data):
    good = json.dumps({"features": german_credit_data.records()[1]}).encode()
    tensor = http.InferInput("payload", [3, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[good], [b"{"], [good]], dtype=object))
    with pytest.raises(InferenceServerException, match="record 1: payload: not valid JSON"):
        http_client.infer("risk_pipeline", [tensor])


def test_scorer_fails_only_the_request_with_an_index_outside_the_vocabulary(triton, feature_spec,
                                                                              german_credit_data, legacy_scores):
    categorical, numeric = encode_columns(feature_spec, german_credit_data.take(np.arange(2)).columns)
    broken = categorical[:1].copy()
    broken[0, 0] = 10_000

    def inputs(cat, num):
        a, b = http.InferInput("categorical", list(cat.shape), "INT64"), http.InferInput("numeric", list(num.shape), "FP32")
        a.set_data_from_numpy(cat)
        b.set_data_from_numpy(num)
        return [a, b]

    client = http.InferenceServerClient(triton.http_url, concurrency=4)
    try:
        pending = [client.async_infer("risk_scorer", inputs(categorical[:1], numeric[:1])),
                   client.async_infer("risk_scorer", inputs(broken, numeric[:1])),
                   client.async_infer("risk_scorer", inputs(categorical[1:], numeric[1:]))]
        first = pending[0].get_result()
        with pytest.raises(InferenceServerException, match="onnxruntime"):
            pending[1].get_result()
        third = pending[2].get_result()
    finally:
        client.close()
    assert first.as_numpy("probability").shape == (1, 1)
    assert third.as_numpy("probability").shape == (1, 1)
    # The batch-mates of the bad request are scored as if it were not there.
    assert abs(first.as_numpy("probability")[0, 0] - legacy_scores[0]) <= 1e-5
    assert abs(third.as_numpy("probability")[0, 0] - legacy_scores[1]) <= 1e-5
