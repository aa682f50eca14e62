"""One error vocabulary: kinds map to Triton codes, upstream codes map back to kinds, never by message text."""
import pytest

from s2t.backends.runtime import fault_points
from s2t.backends.runtime.serving_errors import (INTERNAL, INVALID, TRITON_CODE, UNAVAILABLE, InternalError, InvalidInput, NotServing,
                                                 Unavailable, from_triton_code, of_kind, triton_error)


class TritonError:
    """The shape of pb_utils.TritonError in 2.51 (its codes are plain ints), for the pure functions only."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message, code):
        self.message, self.code = message, code


@pytest.mark.parametrize("error, kind, code", [
    (InvalidInput("features.purpose: missing"), INVALID, "INVALID_ARG"),
    (Unavailable("overloaded"), UNAVAILABLE, "UNAVAILABLE"),
    (NotServing("risk_scorer:3 not loaded"), UNAVAILABLE, "UNAVAILABLE"),
    (InternalError("boom"), INTERNAL, "INTERNAL"),
])
def test_each_kind_becomes_its_triton_code_in_a_new_error_object(error, kind, code):
    first, second = triton_error(error, TritonError), triton_error(error, TritonError)
    assert error.kind == kind and TRITON_CODE[kind] == code
    assert first.code == getattr(TritonError, code) and first.message == error.message
    assert first is not second


@pytest.mark.parametrize("code, error_class", [
    ("INVALID_ARG", InvalidInput), ("NOT_FOUND", NotServing), ("UNAVAILABLE", NotServing),
    ("CANCELLED", Unavailable), ("INTERNAL", InternalError), ("UNKNOWN", InternalError),
    ("UNSUPPORTED", InternalError),
])
def test_an_upstream_error_is_classified_by_its_code_not_its_text(code, error_class):
    error = from_triton_code(getattr(TritonError, code), "Request for unknown model: 'x' is not found", TritonError)
    assert type(error) is error_class


def test_an_unknown_code_is_internal():
    assert type(from_triton_code(99, "?", TritonError)) is InternalError


def test_the_ensemble_prefix_of_a_step_error_is_not_passed_on():
    assert of_kind(INVALID, "in ensemble 'risk_pipeline', payload: empty").message == "payload: empty"


@pytest.mark.parametrize("text, points", [
    ("", {}), ("a.b", {"a.b": 1.0}), ("a.b=0.25, c.d", {"a.b": 0.25, "c.d": 1.0}),
])
def test_fault_points_are_read_as_name_and_share(text, points):
    assert fault_points.parse(text) == points


def test_a_fault_share_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="within 0..1"):
        fault_points.parse("a=2")


def test_without_fault_points_nothing_fails():
    for _ in range(100):
        fault_points.check("skill_adapter.execute")
