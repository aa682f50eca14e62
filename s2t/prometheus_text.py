"""Prometheus text exposition (what Triton's /metrics page and risk_router's counters serve), read one way.

A sample is keyed by its name and its labels; comments, blank lines and samples whose value is not a number are
skipped (one garbled line must not hide the rest of the page), and an optional timestamp after the value is dropped.
"""
from __future__ import annotations

import re
import urllib.request

Metrics = dict[tuple[str, frozenset], float]

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Metrics:
    samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            number = float(match.group(3))
        except ValueError:
            continue
        samples[(match.group(1), frozenset(_LABEL.findall(match.group(2) or "")))] = number
    return samples


def scrape(metrics_url: str, timeout_s: float = 10.0) -> Metrics:
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        return parse_metrics(response.read().decode(errors="replace"))


def samples_named(metrics: Metrics, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called `name`."""
    return [(dict(labels), value) for (sample, labels), value in metrics.items() if sample == name]
