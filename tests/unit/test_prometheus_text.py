"""s2t/prometheus_text.py: the one reader of Prometheus text pages (Triton's /metrics, risk_router's counters)."""
import pytest

from s2t.prometheus_text import parse_metrics, samples_named
from s2t.serve.healing import request_counters

PAGE = """# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="risk_scorer",version="1"} 12
s2t_router_call_seconds_bucket{served_by="risk_scorer:2",le="+Inf"} 3

up 1
"""


@pytest.mark.parametrize("line, expected", [
    ('a{x="1"} 2', {("a", frozenset({("x", "1")})): 2.0}),
    ('a 2.5e3', {("a", frozenset()): 2500.0}),
    ('a{le="+Inf"} +Inf', {("a", frozenset({("le", "+Inf")})): float("inf")}),
    ('a{x="say \\"hi\\", twice"} 1', {("a", frozenset({("x", 'say \\"hi\\", twice')})): 1.0}),
    ('  a{x="1"} 4  ', {("a", frozenset({("x", "1")})): 4.0}),
    # The exposition format allows a timestamp (ms) after the value.
    ('a{x="1"} 7 1700000000000', {("a", frozenset({("x", "1")})): 7.0}),
    ('# a 1', {}),
    ('a{x="1"} not-a-number', {}),
    ('a{x="1"}', {}),
    ('{x="1"} 1', {}),
])
def test_a_line_is_read_as_its_sample_or_skipped(line, expected):
    assert parse_metrics(line) == expected


def test_a_garbled_line_does_not_hide_the_rest_of_the_page():
    page = PAGE + 'nv_inference_request_success{model="risk_scorer",version="2"} garbled\n'
    assert samples_named(parse_metrics(page), "nv_inference_request_success") == [
        ({"model": "risk_scorer", "version": "1"}, 12.0)]
    assert parse_metrics(page)[("up", frozenset())] == 1.0


def test_timestamped_request_counters_are_counted():
    page = ('nv_inference_request_success{model="risk_scorer",version="1"} 12 1700000000000\n'
            'nv_inference_request_failure{model="risk_scorer",reason="BACKEND",version="1"} 2 1700000000000\n')
    assert request_counters(parse_metrics(page)) == {"risk_scorer": (12.0, 2.0)}
