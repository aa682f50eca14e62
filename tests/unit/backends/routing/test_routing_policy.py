import math
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.runtime.serving_errors import INVALID, InvalidInput
from s2t.backends.routing.routing_policy import (BUCKETS, MAX_ROUTE_CHARS, RoutingSettings, Target, bucket, route,
                                                 route_parameter)
from tests.conftest import ROOT

PRIMARY, CANDIDATE = Target("risk_scorer", 1), Target("risk_scorer", 2)


def settings(**kw):
    return RoutingSettings(PRIMARY, CANDIDATE, fallback=Target("risk_scorer_lite"), **kw)


@pytest.mark.parametrize("text, target", [
    ("risk_scorer", Target("risk_scorer")), ("risk_scorer:2", Target("risk_scorer", 2)),
    (" risk_scorer_lite:10 ", Target("risk_scorer_lite", 10)),
])
def test_targets_parse_and_print_as_model_colon_version(text, target):
    assert Target.parse(text) == target
    assert str(target) == text.strip()


@pytest.mark.parametrize("text", [":2", "risk_scorer:two", ""])
def test_malformed_targets_are_refused(text):
    with pytest.raises(ValueError):
        Target.parse(text)


def test_ten_percent_canary_takes_ten_percent_of_requests_within_the_binomial_bound():
    n, p = 20_000, 0.10
    to_candidate = sum(route(settings(canary_percent=10), f"r-{i}").target == CANDIDATE for i in range(n))
    assert abs(to_candidate - n * p) <= 4 * math.sqrt(n * p * (1 - p))


@given(st.text(min_size=1, max_size=20))
def test_assignment_is_sticky_for_a_request_id(request_id):
    assert route(settings(canary_percent=30), request_id) == route(settings(canary_percent=30), request_id)


@given(st.text(min_size=1, max_size=20))
def test_raising_the_share_never_moves_a_request_back_to_the_primary(request_id):
    if route(settings(canary_percent=10), request_id).target == CANDIDATE:
        assert route(settings(canary_percent=20), request_id).target == CANDIDATE


def test_shadow_answers_from_the_primary_and_mirrors_a_sample():
    routes = [route(settings(shadow_percent=25), f"r-{i}") for i in range(4000)]
    assert all(r.target == PRIMARY for r in routes)
    mirrored = sum(r.mirror == CANDIDATE for r in routes)
    assert 800 <= mirrored <= 1200


@pytest.mark.parametrize("override, target", [
    ("primary", PRIMARY), ("candidate", CANDIDATE), ("risk_scorer_lite:1", Target("risk_scorer_lite", 1)),
])
def test_a_route_override_colours_the_request(override, target):
    assert route(settings(canary_percent=50), "r-1", override).target == target


@pytest.mark.parametrize("override, message", [
    (1, "route: expected a string, got int"),
    (True, "route: expected a string, got boolean"),
    ([], "route: expected a string, got list"),
    ({"model": "risk_scorer"}, "route: expected a string, got dict"),
    ("x" * (MAX_ROUTE_CHARS + 1), f"route: {MAX_ROUTE_CHARS + 1} characters is over the limit"),
    ("a" * 300, "route: 300 characters is over the limit"),
    ("/", "route: '/' is not served here"),
    ("../..", "route: '../..' is not served here"),
    ("risk_decision", "route: 'risk_decision' is not served here"),
    (":3", "a model name is required"),
    ("risk_scorer:²", "the version must be a number"),
    ("risk_scorer:" + "9" * 19, "the version must be a number of at most 18 digits"),
])
def test_a_route_the_router_does_not_serve_is_the_callers_error_naming_route(override, message):
    with pytest.raises(InvalidInput) as err:
        route(settings(), "r-1", override)
    assert err.value.kind == INVALID and message in err.value.message


@given(st.one_of(st.text(max_size=300), st.integers(), st.booleans(), st.floats(), st.none(),
                 st.lists(st.integers(), max_size=3)))
def test_any_route_value_is_a_target_of_the_router_or_its_own_error(override):
    try:
        target = route(settings(), "r-1", override).target
    except InvalidInput as err:
        assert err.message.startswith("route: ")
    else:
        assert target.model in settings().models


@pytest.mark.parametrize("kw, message", [
    ({"canary_percent": 101}, "within 0..100"),
    ({"canary_percent": 10, "shadow_percent": 10}, "not both"),
])
def test_inconsistent_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        settings(**kw)


def test_a_share_without_a_candidate_is_refused():
    with pytest.raises(ValueError, match="needs a candidate"):
        RoutingSettings(PRIMARY, None, canary_percent=5)


def test_settings_come_from_config_parameters_and_describe_the_split():
    params = {"primary": {"string_value": "risk_scorer"}, "candidate": {"string_value": "risk_scorer:2"},
              "canary_percent": {"string_value": "10"}, "fallback": {"string_value": "risk_scorer_lite"}}
    parsed = read_parameters(RoutingSettings, params)
    assert parsed == RoutingSettings(Target("risk_scorer"), CANDIDATE, 10.0, 0.0, Target("risk_scorer_lite"))
    assert parsed.describe() == "90% risk_scorer, 10% risk_scorer:2"


def test_buckets_are_stable_and_in_range():
    assert bucket("r-1") == bucket(b"r-1")
    assert all(0 <= bucket(f"k{i}") < BUCKETS for i in range(1000))


def test_buckets_are_the_same_in_another_process_with_another_hash_seed():
    """Sticky across router instances and restarts: nothing may depend on Python's per-process hash()."""
    keys = [f"r-{i}" for i in range(50)]
    code = f"from s2t.backends.routing.routing_policy import bucket; print([bucket(k) for k in {keys!r}])"
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str([bucket(k) for k in keys])


@pytest.mark.parametrize("key", ["\ud800", "r-\udfff", b"\xff\xfe"])
def test_a_request_id_with_a_lone_surrogate_or_raw_bytes_still_gets_a_sticky_bucket(key):
    assert route(settings(canary_percent=50), key) == route(settings(canary_percent=50), key)
    assert 0 <= bucket(key) < BUCKETS


@pytest.mark.parametrize("text, expected", [(None, None), ("", None), ("{}", None), ('{"route": "risk_scorer:2"}',
                                            "risk_scorer:2"), ('{"route": 7}', 7), ("not json", None), ("[1]", None)])
def test_the_route_parameter_is_read_as_sent_and_absent_when_unreadable(text, expected):
    assert route_parameter(text) == expected
