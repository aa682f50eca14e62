"""backends/runtime/triton_glue.py through the wheel's triton_python_backend_utils (tests/unit/python_backend.py): the
per-request errors, the catch-all, joining and splitting a dynamic batch, BLS error mapping (decoupled streams too),
the decoupled take-in and each_stream, and the settings read with unknown keys reported and files resolved."""
from __future__ import annotations

import ast
import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from s2t.backends.runtime import fault_points
from s2t.backends.runtime.decoupled_sender import StreamSender
from s2t.backends.runtime.serving_errors import InternalError, InvalidInput, NotServing, Unavailable
from s2t.backends.runtime.model_parameters import VERSION_FOLDER, ParameterError, parameter, path_parameter
from s2t.backends.runtime.triton_glue import FinishedStreams, Glue, MetricRefused, ModelArgs, Rows
from tests.conftest import ROOT
from tests.unit import python_backend as backend
from tests.unit.fake_clock import Clock
from tests.unit.python_backend import TritonError, request


@pytest.fixture
def glue():
    return Glue(backend.backend_utils(), "toy")


def model_args(config: dict) -> ModelArgs:
    return ModelArgs.of({"model_config": json.dumps(config), "model_name": "toy", "model_repository": "/r/toy",
                         "model_version": "3"})


class Doubler:
    """A toy model: doubles `x`; a negative row is a bad record; a NaN row breaks the function."""

    def __init__(self, glue):
        self.execute = glue.batch("x")(Doubler._double).__get__(self)

    def _double(self, x):
        if np.isnan(x).any():
            raise RuntimeError("secret detail")
        return Rows({"y": x * 2}, [f"x: negative, got {v}" if v < 0 else None for v in x.ravel()])


def column(*values) -> np.ndarray:
    return np.array([[v] for v in values], dtype=np.float32)


@pytest.mark.parametrize("err, code", [(InvalidInput("x: bad"), TritonError.INVALID_ARG),
                                       (Unavailable("busy"), TritonError.UNAVAILABLE),
                                       (NotServing("gone"), TritonError.UNAVAILABLE),
                                       (InternalError("broke"), TritonError.INTERNAL)])
def test_each_error_response_gets_its_own_triton_error_with_the_kinds_code(glue, err, code):
    first, second = glue.error(err), glue.error(err)
    assert first.error() is not second.error()  # a TritonError shared between responses crashes Triton 2.51
    assert (first.error().code(), first.error().message()) == (code, err.message)


def test_a_batch_is_joined_for_the_function_and_split_back_in_request_order(glue):
    responses = Doubler(glue).execute([request(x=column(1, 2)), request(x=column(3)), request(x=column(4, 5, 6))])
    assert [r.output("y").ravel().tolist() for r in responses] == [[2, 4], [6], [8, 10, 12]]


def test_a_bad_row_fails_its_own_request_naming_the_field_and_its_batch_mates_are_answered(glue):
    responses = Doubler(glue).execute([request(x=column(1)), request(x=column(2, -1)), request(x=column(3))])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert responses[1].error().code() == TritonError.INVALID_ARG
    assert responses[1].error().message() == "record 1: x: negative, got -1.0"
    assert responses[2].output("y").ravel().tolist() == [6]


def test_a_failing_function_answers_every_request_internal_without_details_and_logs_the_traceback(glue):
    responses = Doubler(glue).execute([request(x=column(1)), request(x=column(np.nan))])
    assert [(r.error().code(), r.error().message()) for r in responses] == [(TritonError.INTERNAL,
                                                                             "toy: internal error")] * 2
    assert responses[0].error() is not responses[1].error()
    logged = [text for level, text in backend.Logger.lines if level == "error"]
    assert any("Traceback" in text and "secret detail" in text for text in logged)


def test_the_fault_point_is_named_after_the_model(glue, monkeypatch):
    monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse("toy.execute"))
    responses = Doubler(glue).execute([request(x=column(1))])
    assert responses[0].error().message() == "toy: internal error"


@pytest.mark.parametrize("code, kind", [(TritonError.INVALID_ARG, InvalidInput), (TritonError.UNAVAILABLE, NotServing),
                                        (TritonError.NOT_FOUND, NotServing), (TritonError.CANCELLED, Unavailable),
                                        (TritonError.INTERNAL, InternalError), (TritonError.UNKNOWN, InternalError)])
def test_a_bls_error_comes_back_as_the_callers_kind_by_code(glue, code, kind):
    glue.pb.InferenceRequest.bls["other"] = lambda bls: backend.InferenceResponse(error=TritonError("said no", code))
    with pytest.raises(kind) as raised:
        glue.infer("other", {"x": column(1)}, ["y"])
    assert type(raised.value) is kind and raised.value.message == "said no"


def test_a_bls_call_or_stream_that_raises_is_logged_and_answered_internal_without_details(glue):
    def broken(bls):
        raise RuntimeError("stub detail")

    glue.pb.InferenceRequest.bls["other"] = broken
    with pytest.raises(InternalError, match="^toy: internal error calling other$"):
        glue.infer("other", {"x": column(1)}, ["y"])
    with pytest.raises(InternalError, match="^toy: while scoring$"):
        glue.infer("other", {"x": column(1)}, ["y"], failure="while scoring")
    with pytest.raises(InternalError, match="^toy: internal error calling other$"):
        list(glue.stream("other", {"x": column(1)}, ["y"]))
    assert any("stub detail" in text for level, text in backend.Logger.lines if level == "error")


def test_a_bls_call_returns_the_outputs_asked_for_in_order(glue):
    def both(bls):
        x = bls.inputs()[0].as_numpy()
        return backend.InferenceResponse([backend.Tensor("a", x + 1), backend.Tensor("b", x * 10)])

    glue.pb.InferenceRequest.bls["other"] = both
    b, a = glue.infer("other", {"x": column(1, 2)}, ["b", "a"], version=2)
    assert b.ravel().tolist() == [10, 20] and a.ravel().tolist() == [2, 3]


def test_a_decoupled_take_in_that_fails_sends_each_request_one_final_internal_error(glue):
    requests = [request(x=column(1)), request(x=column(2))]
    taken, result = glue.take_in(requests, lambda senders: 1 / 0)
    assert (taken, result) == (False, None)
    sent = [r.sender.sent for r in requests]
    assert all(len(s) == 1 and s[0][1] == 1 and s[0][0].error().code() == TritonError.INTERNAL for s in sent)
    assert sent[0][0][0].error() is not sent[1][0][0].error()
    assert glue.take_in(requests[:1], len) == (True, 1)


def test_a_model_that_answers_later_refuses_a_config_that_is_not_decoupled(glue):
    with pytest.raises(ValueError, match="toy waits: its config must set model_transaction_policy"):
        glue.require_decoupled(model_args({}), "waits")
    glue.require_decoupled(model_args({"model_transaction_policy": {"decoupled": True}}), "waits")


@dataclass(frozen=True)
class ToySettings:
    window_ms: int = parameter("window_ms", 10)


def test_settings_are_read_once_with_keys_the_model_does_not_read_reported(glue):
    args = model_args({"parameters": {"window_ms": {"string_value": "25"}, "windw_ms": {"string_value": "5"}}})
    assert glue.settings(ToySettings, args) == ToySettings(25)
    assert ("warn", "toy: parameters windw_ms are not ones it reads") in backend.Logger.lines
    assert (args.version_dir, args.repository) == (args.folder / "3", args.folder.parent)
    with pytest.raises(ParameterError, match="parameter window_ms: expected an integer"):
        glue.settings(ToySettings, model_args({"parameters": {"window_ms": {"string_value": "soon"}}}))


def test_settings_not_strict_leave_extra_keys_to_another_reader(glue):
    args = model_args({"parameters": {"native_only": {"string_value": "1"}}})
    assert glue.settings(ToySettings, args, strict=False) == ToySettings()
    assert not [line for line in backend.Logger.lines if line[0] == "warn"]


@dataclass(frozen=True)
class OtherSettings:
    slots: int = parameter("slots", 1)


def test_a_key_is_unknown_only_when_no_settings_type_of_the_model_reads_it(glue):
    args = model_args({"parameters": {k: {"string_value": "2"} for k in ("window_ms", "slots", "slot")}})
    assert glue.report_unknown(args, ToySettings, OtherSettings) == ["slot"]
    assert glue.settings(OtherSettings, args, strict=False) == OtherSettings(2)
    assert [text for level, text in backend.Logger.lines if level == "warn"] == [
        "toy: parameters slot are not ones it reads"]


def test_an_absent_control_flag_is_false_and_a_present_one_is_read(glue):
    assert glue.flag(request(x=column(1)), "START") is False
    assert glue.flag(request(START=np.array([[True]])), "START") is True
    assert glue.flag(request(END=np.array([[False]])), "END") is False


@dataclass(frozen=True)
class Files:
    weights: Path | None = path_parameter("weights", None)
    table: Path = path_parameter("table", Path("table.onnx"), within=VERSION_FOLDER)


def test_a_file_parameter_is_resolved_in_the_models_folders_and_other_parameters_can_replace_the_configs(glue):
    args = model_args({"parameters": {"weights": {"string_value": "w.gguf"}}})
    assert glue.settings(Files, args) == Files(Path("/r/toy/w.gguf"), Path("/r/toy/3/table.onnx"))
    moved = args.with_parameters({"weights": {"string_value": "/elsewhere/w.gguf"}})
    assert glue.settings(Files, moved).weights == Path("/elsewhere/w.gguf")
    assert (moved.name, moved.version, args.parameters["weights"]) == ("toy", "3", {"string_value": "w.gguf"})


def test_only_the_optional_inputs_a_request_carries_are_read(glue):
    read = glue.inputs(request(x=column(1), z=column(3)), ["x", "y", "z"])
    assert {name: array.ravel().tolist() for name, array in read.items()} == {"x": [1], "z": [3]}


def streaming_model(glue):
    """A toy decoupled model: each request answered twice `x` from its outbox; a negative `x` is refused as bad
    input, a NaN breaks the handler."""

    class Streaming:
        def __init__(self):
            self.outbox, self.refused = glue.outbox(), []

        def _refuse(self, sender, err):
            self.refused.append(err.kind)
            self.outbox.put(lambda: sender.refuse(err))

        @glue.each_stream(refuse=_refuse)
        def execute(self, request, sender):
            x = glue.input(request, "x")
            if np.isnan(x).any():
                raise RuntimeError("secret detail")
            if (x < 0).any():
                raise InvalidInput(f"x: negative, got {x.min()}")
            self.outbox.put(lambda: sender.finish([glue.pb.Tensor("y", x * 2)]))

    return Streaming()


def one_final_response(req):
    """The only response a decoupled request got; it must carry the final flag."""
    assert len(req.sender.sent) == 1 and req.sender.sent[0][1] == backend.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    return req.sender.sent[0][0]


def test_each_stream_refuses_a_bad_or_broken_request_alone_and_answers_the_others(glue):
    model = streaming_model(glue)
    requests = [request(x=column(1)), request(x=column(-2)), request(x=column(np.nan)), request(x=column(4))]
    assert model.execute(requests) is None
    model.outbox.close()
    good, bad, broken, last = [one_final_response(r) for r in requests]
    assert good.output("y").ravel().tolist() == [2] and last.output("y").ravel().tolist() == [8]
    assert (bad.error().code(), bad.error().message()) == (TritonError.INVALID_ARG, "x: negative, got -2.0")
    assert (broken.error().code(), broken.error().message()) == (TritonError.INTERNAL, "toy: internal error")
    assert model.refused == ["invalid", "internal"]
    assert any("secret detail" in text for level, text in backend.Logger.lines if level == "error")


def test_each_stream_fault_point_refuses_every_request_with_its_own_error(glue, monkeypatch):
    monkeypatch.setattr(fault_points, "_POINTS", fault_points.parse("toy.execute"))
    model = streaming_model(glue)
    requests = [request(x=column(1)), request(x=column(2))]
    model.execute(requests)
    model.outbox.close()
    first, second = [one_final_response(r) for r in requests]
    assert [r.error().message() for r in (first, second)] == ["toy: internal error"] * 2
    assert first.error() is not second.error()


def test_a_stream_sender_refuses_once_with_the_kinds_code():
    req = request(x=column(1))
    sender = StreamSender(req.get_response_sender(), backend.backend_utils())
    assert sender.refuse(Unavailable("busy, retry")) is True
    assert sender.refuse(InvalidInput("x: late")) is False and sender.finish() is False
    response = one_final_response(req)
    assert (response.error().code(), response.error().message()) == (TritonError.UNAVAILABLE, "busy, retry")


def words(*texts):
    return [backend.InferenceResponse([backend.Tensor("text", np.array([t], dtype=object))]) for t in texts]


def test_a_decoupled_bls_stream_yields_each_responses_outputs_and_none_for_one_it_lacks(glue):
    glue.pb.InferenceRequest.bls["talker"] = lambda bls: iter([*words(b"a", b"b"), backend.InferenceResponse()])
    pieces = list(glue.stream("talker", {"x": column(1)}, ["text"]))
    assert [p[0] if p[0] is None else p[0].tolist() for p in pieces] == [[b"a"], [b"b"], None]


@pytest.mark.parametrize("code, kind", [(TritonError.INVALID_ARG, InvalidInput), (TritonError.UNAVAILABLE, NotServing),
                                        (TritonError.INTERNAL, InternalError)])
def test_a_decoupled_bls_stream_raises_its_error_as_the_callers_kind_after_the_pieces_before_it(glue, code, kind):
    glue.pb.InferenceRequest.bls["talker"] = lambda bls: iter(
        [*words(b"a"), backend.InferenceResponse(error=TritonError("stopped", code)), *words(b"never")])
    stream = glue.stream("talker", {"x": column(1)}, ["text"])
    assert next(stream)[0].tolist() == [b"a"]
    with pytest.raises(kind) as raised:
        next(stream)
    assert type(raised.value) is kind and raised.value.message == "stopped"
class Scorer:
    """A toy of risk_pipeline's shape: per row a float `probability` and a BYTES `decision`."""

    def __init__(self, glue):
        self.execute = glue.batch("x", ravel=True)(Scorer._score).__get__(self)

    def _score(self, x):
        return Rows({"probability": x.reshape(-1, 1) / 10, "decision": np.where(x > 5, b"DECLINE", b"APPROVE")
                     .astype(object).reshape(-1, 1)})


def python_calls(fn) -> int:
    """Python and C functions `fn` calls, counted by a profile hook: a measure of work that a busy machine does
    not move, unlike time."""
    count = 0

    def hook(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_a_batch_of_one_record_requests_is_answered_with_few_calls_per_request(glue):
    # The hot path: a dynamic batch of one-record requests, each answered with a float and a BYTES tensor that the
    # stub serializes as it builds it (with the wheel's serializer and a slice per output and request: 24.6 calls
    # per request; the count is exact, so the budget holds on any machine).
    requests = [request(x=column(v)) for v in range(16)]
    model = Scorer(glue)
    responses = model.execute(requests)
    assert [r.output("decision").tolist() for r in responses] == [[[b"APPROVE"]]] * 6 + [[[b"DECLINE"]]] * 10
    assert [r.output("probability").shape for r in responses] == [(1, 1)] * 16
    assert python_calls(lambda: model.execute(requests)) / len(requests) <= 20


def test_requests_of_several_records_get_their_own_rows_in_the_shape_they_came(glue):
    responses = Scorer(glue).execute([request(x=column(1, 9)), request(x=column(3)), request(x=column(7, 2, 8))])
    assert [r.output("decision").ravel().tolist() for r in responses] == [
        [b"APPROVE", b"DECLINE"], [b"APPROVE"], [b"DECLINE", b"APPROVE", b"DECLINE"]]
    assert [r.output("probability").shape for r in responses] == [(2, 1), (1, 1), (3, 1)]


def test_the_glue_gives_the_stub_bytes_converters_with_the_wheels_results(glue):
    wheel = backend.backend_utils()  # a fresh module: the wheel's own converters
    serialize, deserialize = glue.pb.serialize_byte_tensor, glue.pb.deserialize_bytes_tensor
    assert serialize is not wheel.serialize_byte_tensor and deserialize is not wheel.deserialize_bytes_tensor
    for array in (np.array([[b"APPROVE"]], dtype=object), np.array([b"a", b"", b"\x00z"], dtype=object),
                  np.array([["x", "y"]], dtype=object), np.array([b"ab", b"c"]), np.array([], dtype=object)):
        assert serialize(array) == wheel.serialize_byte_tensor(array)
    for raw in (b"\x03\x00\x00\x00abc", b"", b"\x00\x00\x00\x00\x01\x00\x00\x00z"):
        encoded = np.frombuffer(raw, dtype=np.uint8)
        assert deserialize(encoded).tolist() == wheel.deserialize_bytes_tensor(encoded).tolist()
        assert deserialize(encoded).dtype == np.object_


def test_in_a_batch_of_one_record_requests_only_the_bad_record_fails_and_the_others_keep_their_rows(glue):
    responses = Doubler(glue).execute([request(x=column(v)) for v in (1, -2, 3, -4, 5)])
    assert [r.has_error() for r in responses] == [False, True, False, True, False]
    assert [r.error().message() for r in responses if r.has_error()] == ["x: negative, got -2.0",
                                                                         "x: negative, got -4.0"]
    assert [r.output("y").tolist() for r in responses if not r.has_error()] == [[[2.0]], [[6.0]], [[10.0]]]


def a_finished_stream(glue, *texts) -> weakref.ref:
    """A weak reference to the iterator of a stream the glue read to its end, handed out once by the BLS call and
    let go of by everyone but the glue."""
    iterator = (response for response in [*words(*texts), backend.InferenceResponse()])
    handed, watched = [iterator], weakref.ref(iterator)
    del iterator
    glue.pb.InferenceRequest.bls["talker"] = lambda bls: handed.pop()
    list(glue.stream("talker", {"x": column(1)}, ["text"]))
    gc.collect()
    return watched


def test_a_finished_bls_streams_iterator_is_kept_past_the_stubs_clean_up_then_dropped_by_a_later_stream(glue):
    # Dropped by Python before the stub's clean-up thread erased it, the stub destroyed the iterator and its
    # responses' arrays without the GIL: a corrupted heap and a SIGSEGV later.
    clock = Clock(now=0.0)
    glue.finished_streams = FinishedStreams(hold_s=10.0, clock=clock)
    first = a_finished_stream(glue, b"a", b"b")
    assert first() is not None, "kept after the stream ended and its caller let go"
    clock.now = 9.0
    second = a_finished_stream(glue, b"c")
    assert first() is not None and second() is not None
    clock.now = 10.5
    third = a_finished_stream(glue, b"d")
    assert first() is None, "dropped, by the Python thread of a later stream, once past the hold"
    assert second() is not None and third() is not None and len(glue.finished_streams) == 2


def test_a_stub_that_dies_of_a_signal_leaves_each_threads_python_stack_in_the_log():
    crash = ("import ctypes\nfrom tests.unit import python_backend as backend\nfrom s2t.backends.runtime.triton_glue import Glue\n"
             "glue = Glue(backend.backend_utils(), 'toy')\nctypes.string_at(0)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    done = subprocess.run([sys.executable, "-c", crash], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr and 'File "<string>", line 5' in done.stderr


class DyingFamily:
    """pb_utils.MetricFamily as far as its end goes: the stub deletes a family or metric (a message to the server)
    when Python lets go of it; these record each one deleted."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    deleted: list[str] = []

    def __init__(self, name, description, kind):
        self.name = name

    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the stub's spelling
        return DyingMetric(f"{self.name}{labels}")

    def __del__(self):
        DyingFamily.deleted.append(self.name)


class DyingMetric(backend.Metric):
    def __init__(self, name):
        super().__init__({})
        self.name = name

    def __del__(self):
        DyingFamily.deleted.append(self.name)


class RequestMetrics:
    """Like the metric classes of backends/: families and metrics kept in attributes for the model's life."""

    def __init__(self, metric_family):
        self.family = metric_family("requests_total", "requests", metric_family.COUNTER)
        self.ok, self.failed = (self.family.Metric(labels={"outcome": o}) for o in ("ok", "failed"))


def test_metrics_made_through_the_glue_are_never_deleted_not_even_after_finalize_and_a_full_collection(glue):
    # Triton 2.51 deletes them unsafely both ways: from the stub's teardown (the stub dies of a SIGSEGV) and from a
    # finalize (the server frees the metric a reloaded model's new instance shares, and aborts).
    glue.pb.MetricFamily, DyingFamily.deleted = DyingFamily, []
    model = Model()
    model.metrics = RequestMetrics(glue.metric_family)
    model.metrics.ok.increment(1)
    glue.finalize(model)
    gc.collect()
    assert DyingFamily.deleted == []


def test_the_glues_metrics_pass_kinds_labels_buckets_and_values_through_to_tritons(glue):
    family = glue.metric_family(name="latency", description="seconds", kind=glue.metric_family.HISTOGRAM)
    metric = family.Metric(labels={"model": "toy"}, buckets=[0.1, 1.0])
    metric.observe(0.5)
    gauge = glue.metric_family("depth", "queued", glue.metric_family.GAUGE).Metric(labels={})
    gauge.set(3.0)
    gauge.increment(2.0)
    made = backend.MetricFamily.families
    assert (made["latency"].kind, made["latency"].metrics[0].labels, made["latency"].metrics[0].observed) == (
        "histogram", {"model": "toy"}, [0.5])
    assert made["depth"].kind == "gauge" and gauge.value() == made["depth"].metrics[0].value() == 5.0


@pytest.mark.parametrize("kind, operation, value", [
    ("COUNTER", "increment", -1.0), ("COUNTER", "increment", float("nan")), ("COUNTER", "set", 1.0),
    ("COUNTER", "observe", 1.0), ("GAUGE", "observe", 1.0), ("HISTOGRAM", "increment", 1.0),
    ("HISTOGRAM", "set", 1.0), ("HISTOGRAM", "value", None)])
def test_a_metric_update_triton_would_refuse_is_refused_before_it_reaches_triton(glue, kind, operation, value):
    # Triton 2.51's stub frees the server's refusal twice: its shared memory is corrupted and it dies soon after.
    metric = glue.metric_family("m", "m", getattr(glue.metric_family, kind)).Metric(labels={})
    with pytest.raises(MetricRefused):
        getattr(metric, operation)(*([] if value is None else [value]))
    made = backend.MetricFamily.families["m"].metrics[0]
    assert (made.value(), made.observed) == (0.0, [])


@pytest.mark.parametrize("kind, operation, value", [
    ("COUNTER", "increment", 0), ("COUNTER", "increment", np.int64(3)), ("COUNTER", "value", None),
    ("GAUGE", "increment", -2.0), ("GAUGE", "set", float("nan")), ("GAUGE", "value", None),
    ("HISTOGRAM", "observe", -0.5)])
def test_a_metric_update_triton_takes_goes_through(glue, kind, operation, value):
    metric = glue.metric_family("m", "m", kind=getattr(glue.metric_family, kind)).Metric(labels={})
    getattr(metric, operation)(*([] if value is None else [value]))


class OverlapMetric(backend.Metric):
    """Records whether two threads were ever inside one of its updates at once."""

    def __init__(self, labels):
        super().__init__(labels)
        self.inside, self.overlapped = 0, False

    def increment(self, amount):
        self.inside += 1
        self.overlapped |= self.inside > 1
        time.sleep(0.001)
        super().increment(amount)
        self.inside -= 1


class OverlapFamily(backend.MetricFamily):
    def Metric(self, labels=None, buckets=None):  # noqa: N802 - the stub's spelling
        metric = OverlapMetric(labels or {})
        self.metrics.append(metric)
        return metric


def test_one_metric_is_updated_by_one_thread_at_a_time(glue):
    # The stub's increment lets go of the GIL while it rewrites the metric's shared-memory copy.
    glue.pb.MetricFamily = OverlapFamily
    metric = glue.metric_family("m", "m", OverlapFamily.COUNTER).Metric(labels={})
    threads = [threading.Thread(target=lambda: [metric.increment(1) for _ in range(20)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    made = OverlapFamily.families["m"].metrics[0]
    assert (made.overlapped, made.value()) == (False, 80)


class Model:
    """A model instance as the stub holds it until it ends."""


class Served:
    """Stands in for a Triton object (a request, tensor or response) whose deletion needs the stub."""


def test_finalize_deletes_the_triton_objects_the_model_the_glue_and_reference_cycles_hold(glue):
    # What is left after finalize is deleted by the interpreter's last garbage collection, after the stub unmapped
    # its shared memory: the stub dies of a SIGSEGV.
    model, request_in_a_cycle, held_by_the_model = Model(), Served(), Served()
    model.request, model.cycle = held_by_the_model, model
    failure = RuntimeError("the scorer failed")
    failure.request, failure.itself = request_in_a_cycle, failure  # an error kept in a frame its traceback holds
    streamed = a_finished_stream(glue, b"a")
    watched = [weakref.ref(o) for o in (request_in_a_cycle, held_by_the_model)] + [streamed]
    del failure, request_in_a_cycle, held_by_the_model
    gc.disable()  # the collection must be finalize's own
    try:
        assert all(w() is not None for w in watched)
        glue.finalize(model)
        assert [w() for w in watched] == [None, None, None] and vars(model) == {}
    finally:
        gc.enable()


def model_files() -> list[Path]:
    """The models the python backend's stub runs (risk_pipeline runs in the server, backends/runtime/inprocess.py)."""
    return [p for p in sorted(ROOT.glob("model_repository*/*/[0-9]*/model.py"))
            + [ROOT / "backends" / "runtime" / "onnxruntime" / "model.py"] if "class TritonPythonModel" in p.read_text()]


@pytest.mark.parametrize("model_py", model_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_model_keeps_its_metrics_through_the_glue_and_ends_its_finalize_with_the_glues(model_py):
    source = model_py.read_text()
    assert "pb_utils.MetricFamily" not in source, "metrics go through glue.metric_family (kept, never deleted)"
    model = next(node for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ClassDef) and node.name == "TritonPythonModel")
    finalize = next(node for node in model.body if isinstance(node, ast.FunctionDef) and node.name == "finalize")
    last = finalize.body[-1]
    assert isinstance(last, ast.Expr) and re.fullmatch(r"\w*glue\.finalize\(self\)", ast.unparse(last)), \
        "after its threads stop, as the last thing"
