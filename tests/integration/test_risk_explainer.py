"""risk_explainer on the real server: reason codes, the streamed explanation, the forced light path, bad records."""
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from backends.explanation_text import template_explanation
from backends.reason_codes import LinearReasons
from backends.record_decoder import RecordDecoder, parse_record
from clients.llm_client import generate_stream
from tests.conftest import MODEL_REPOSITORY, ROOT


RECORD = json.loads((ROOT / "clients" / "examples" / "record.json").read_text())


def body(record) -> dict:
    return {"payload": json.dumps(record)}


@pytest.fixture(scope="module")
def local_reasons():
    versions = sorted(int(p.name) for p in (MODEL_REPOSITORY / "risk_scorer_lite").iterdir() if p.name.isdigit())
    return LinearReasons(MODEL_REPOSITORY / "risk_scorer_lite" / str(versions[-1]) / "model.onnx")


def pipeline_score(url: str, record) -> tuple[float, str]:
    request = {"inputs": [{"name": "payload", "datatype": "BYTES", "shape": [1, 1], "data": [json.dumps(record)]}]}
    with urllib.request.urlopen(urllib.request.Request(f"http://{url}/v2/models/risk_pipeline/infer",
                                                       data=json.dumps(request).encode()), timeout=30) as response:
        outputs = {o["name"]: o["data"][0] for o in json.loads(response.read())["outputs"]}
    return outputs["probability"], outputs["decision"]


def as_list(value):
    return value if isinstance(value, list) else [value]


def test_reason_codes_add_up_to_the_lite_models_probability(local_reasons, triton_llm):
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    explanation = local_reasons.explain(decoded.categorical, decoded.numeric)[0]
    import onnxruntime as ort
    session = ort.InferenceSession(str(local_reasons_path(local_reasons)))
    lite = session.run(None, {"categorical": decoded.categorical, "numeric": decoded.numeric})[0].ravel()[0]
    assert explanation.probability == pytest.approx(float(lite), abs=1e-6)
    assert 1 <= len(explanation.reasons) <= 3
    assert [r.points for r in explanation.reasons] == sorted((r.points for r in explanation.reasons), reverse=True)


def local_reasons_path(reasons: LinearReasons):
    versions = sorted(int(p.name) for p in (MODEL_REPOSITORY / "risk_scorer_lite").iterdir() if p.name.isdigit())
    return MODEL_REPOSITORY / "risk_scorer_lite" / str(versions[-1]) / "model.onnx"


def test_the_explainer_streams_reason_codes_first_then_the_language_models_words(triton_llm, local_reasons):
    result = generate_stream(triton_llm.http_url, body(RECORD), model="risk_explainer")
    assert result.error is None
    head = result.events[0][1]
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    expected = [r.code() for r in local_reasons.explain(decoded.categorical, decoded.numeric)[0].reasons]
    assert as_list(head["reasons"]) == expected
    probability, decision = pipeline_score(triton_llm.http_url, RECORD)
    assert head["decision"] == decision
    assert head["probability"] == pytest.approx(probability)
    words = [e["text_output"] for _, e in result.events[1:] if e.get("text_output")]
    assert len(words) > 3, "the explanation is streamed token by token"
    assert result.final["source"] == "llm"


def test_a_threshold_near_zero_forces_the_template_and_counts_the_degrade(triton_llm, local_reasons):
    results = [generate_stream(triton_llm.http_url, body(RECORD), model="risk_explainer_light") for _ in range(2)]
    record = parse_record(json.dumps(RECORD).encode())
    decoded = RecordDecoder(local_reasons.spec).decode([json.dumps(RECORD).encode()])
    reasons = local_reasons.explain(decoded.categorical, decoded.numeric)[0].reasons
    for result in results:
        assert result.error is None
        head = result.events[0][1]
        expected = template_explanation(head["decision"], head["probability"], reasons, record.features)
        assert result.final["source"] == "template"
        assert result.final["text_output"] == expected
    with urllib.request.urlopen(f"http://localhost:{triton_llm.metrics_port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    degraded = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("s2t_explainer_degraded_total") and 'model="risk_explainer_light"' in line)
    assert degraded >= 2


def bad(record_change) -> dict:
    record = json.loads(json.dumps(RECORD))
    record_change(record)
    return body(record)


BAD_RECORDS = [
    (bad(lambda r: r["features"].pop("credit_amount")), "features.credit_amount: missing"),
    (bad(lambda r: r["features"].update(duration_in_month="long")), "features.duration_in_month: expected a number"),
    ({"payload": "{not json"}, "payload"),
    ({"payload": ""}, "payload"),
]


def test_bad_records_get_their_own_error_while_concurrent_good_ones_are_explained(triton_llm):
    with ThreadPoolExecutor(len(BAD_RECORDS) + 2) as pool:
        bad_futures = [pool.submit(generate_stream, triton_llm.http_url, b, "risk_explainer_light")
                       for b, _ in BAD_RECORDS]
        good_futures = [pool.submit(generate_stream, triton_llm.http_url, body(RECORD), "risk_explainer_light")
                        for _ in range(2)]
        for (request, message), future in zip(BAD_RECORDS, bad_futures):
            result = future.result()
            assert result.error is not None and message in result.error, (request, result.error)
            assert result.status == 400
        for future in good_futures:
            assert future.result().error is None and future.result().final["source"] == "template"
    assert np.isfinite(pipeline_score(triton_llm.http_url, RECORD)[0])
