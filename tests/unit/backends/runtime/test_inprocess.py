"""The in-process backend's Python side (backends/runtime/inprocess.py) and risk_pipeline's model.py through it,
without a
server: raw tensors of a whole batch in, raw outputs and one answer per request out, as native/python_inprocess.cc
hands them over. A bad record fails its own request only (INVALID_ARG naming the field), an internal failure answers
every request INTERNAL without the details, and nothing raises."""
from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import json_format

from s2t.backends.runtime import bytes_tensor, fault_points, inprocess
from s2t import triton_config
from tests.conftest import ROOT

RECORD = json.loads((ROOT / "clients" / "examples" / "record.json").read_text())
FP32 = 11


def config_json(model_dir) -> str:
    """The model's config as Triton hands it to a backend (TRITONBACKEND_ModelConfig, serialized to JSON)."""
    return json.dumps(json_format.MessageToDict(triton_config.load(model_dir), preserving_proto_field_name=True))


@pytest.fixture
def pipeline(model_repository):
    folder = model_repository / "risk_pipeline"
    return inprocess.load(config_json(folder), "risk_pipeline", str(folder), 1)


def batch(*requests: list) -> tuple[dict, list[int]]:
    """The raw `payload` of requests joined as the backend joins them, and each request's row count."""
    rows = [len(records) for records in requests]
    elements = [json.dumps(r).encode() if isinstance(r, dict) else r for records in requests for r in records]
    return {"payload": (inprocess.BYTES, [len(elements), 1], bytes_tensor.encode(elements))}, rows


def outputs_of(outputs) -> dict:
    found = {}
    for output in outputs:
        if output.datatype == inprocess.BYTES:
            found[output.name] = bytes_tensor.decode(output.raw)
        else:
            found[output.name] = np.frombuffer(output.raw, dtype=inprocess.NUMPY_TYPES[output.datatype])
    return found


def test_each_request_is_answered_and_a_bad_record_fails_its_request_alone(pipeline):
    bad = {**RECORD, "features": {**RECORD["features"], "duration_in_month": "twelve"}}
    outputs, errors = pipeline.execute(*batch([RECORD], [RECORD, bad], [RECORD, RECORD]))
    assert errors[0] is None and errors[2] is None
    code, message = errors[1]
    assert code == 3  # INVALID_ARG
    assert message == 'record 1: features.duration_in_month: expected a number, got string'
    found = outputs_of(outputs)
    assert {o.name: (o.datatype, o.shape) for o in outputs} == {"probability": (FP32, (1,)),
                                                               "decision": (inprocess.BYTES, (1,))}
    assert len(found["probability"]) == len(found["decision"]) == 5
    assert found["probability"][4] == pytest.approx(found["probability"][0])
    assert set(found["decision"]) <= {b"APPROVE", b"REVIEW", b"DECLINE"}


def test_a_lone_bad_record_gets_the_decoders_message_as_the_python_backend_gave_it(pipeline):
    _, errors = pipeline.execute(*batch([b"{not json"], [{"features": {}}], [RECORD]))
    assert errors[0][0] == errors[1][0] == 3 and errors[2] is None
    assert errors[0][1].startswith("payload: not valid JSON")
    assert errors[1][1].startswith("features.")


def test_the_scores_are_the_fused_pipelines_own(pipeline, model_repository):
    from s2t.backends.scoring.fused_pipeline import PipelineSettings, warm_pipeline
    from s2t.backends.runtime.model_parameters import read_parameters
    from s2t.triton_config import backend_parameters, load

    settings = read_parameters(PipelineSettings, backend_parameters(load(model_repository / "risk_pipeline")))
    direct = warm_pipeline(model_repository, settings, "risk_pipeline").score([json.dumps(RECORD).encode()] * 3)
    found = outputs_of(pipeline.execute(*batch([RECORD], [RECORD, RECORD]))[0])
    assert np.array_equal(found["probability"], direct.probability.ravel())
    assert found["decision"] == direct.decision.ravel().tolist()


def test_an_internal_failure_answers_every_request_internal_without_its_details(pipeline, monkeypatch, capsys):
    monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse("risk_pipeline.execute"))
    outputs, errors = pipeline.execute(*batch([RECORD], [RECORD, RECORD]))
    assert outputs == [] and errors == [(1, "risk_pipeline: internal error")] * 2  # INTERNAL
    assert "Traceback" in capsys.readouterr().err


def test_a_model_that_raises_a_serving_error_answers_each_request_with_its_kind():
    from s2t.backends.runtime.serving_errors import Unavailable

    class Refusing:
        INPUTS = ("x",)

        def execute(self, x):
            raise Unavailable("m: not now")

    handler = inprocess.Handler(Refusing(), "m")
    raw = np.arange(3, dtype=np.float32).tobytes()
    assert handler.execute({"x": (FP32, [3, 1], raw)}, [1, 2]) == ([], [(4, "m: not now")] * 2)  # UNAVAILABLE


@pytest.mark.parametrize("array", [np.arange(6, dtype=np.float32).reshape(3, 2), np.arange(3, dtype=np.int64),
                                   np.array([[b"a"], [b""], [b"ccc"]], dtype=object)])
def test_outputs_and_inputs_round_trip_in_tritons_raw_form(array):
    output = inprocess.raw_output("y", array)
    assert output.shape == array.shape[1:]
    back = inprocess.joined_input(output.datatype, list(array.shape), output.raw)
    if array.dtype == object:
        assert back == array.ravel().tolist()
    else:
        assert np.array_equal(back, array)


def test_a_missing_model_file_is_refused_at_load(model_repository, tmp_path):
    folder = tmp_path / "risk_pipeline"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text((model_repository / "risk_pipeline" / "config.pbtxt").read_text())
    with pytest.raises(FileNotFoundError):
        inprocess.load(config_json(folder), "risk_pipeline", str(folder), 1)


def test_the_same_model_py_on_the_python_backend_scores_as_in_process(pipeline, model_repository):
    """`backend: "python"` in its config runs risk_pipeline in a stub of its own: the same answers, each request's
    error its own."""
    from tests.unit import python_backend as backend

    pb_utils = backend.backend_utils()
    folder = model_repository / "risk_pipeline"
    stub_model = backend.initialize(backend.load_model(folder / "1" / "model.py", pb_utils), folder)
    responses = stub_model.execute([backend.request(payload=backend.payloads(RECORD)),
                                    backend.request(payload=backend.payloads(b"{not json")),
                                    backend.request(payload=backend.payloads(RECORD, RECORD))])
    in_process = outputs_of(pipeline.execute(*batch([RECORD], [RECORD, RECORD]))[0])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().message().startswith("payload: not valid JSON")
    stub_probability = [*responses[0].output("probability").ravel(), *responses[2].output("probability").ravel()]
    assert np.array_equal(stub_probability, in_process["probability"])
