"""The language model's alerts and dashboard: promtool fires each alert, and every metric they name is served."""
import json
import re
import shutil
import subprocess
import urllib.request

import pytest
import yaml

from s2t.clients.llm_client import generate_stream
from tests.conftest import ROOT


PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "llm.json"


def _promtool(*args: str) -> None:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed; `make system` installs it (from Debian's prometheus package)")
    result = subprocess.run([exe, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_promtool_accepts_the_llm_rules_and_prometheus_loads_them():
    _promtool("check", "rules", "llm_alerts.yml")
    assert "llm_alerts.yml" in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["rule_files"]


def test_each_llm_alert_fires_on_the_series_that_should_fire_it():
    _promtool("test", "rules", "llm_alerts.test.yml")


def _metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(s2t_(?:llm|explainer)_[a-z_]+?)(?:_bucket)?\b", text))


def test_every_metric_the_alerts_and_panels_name_is_on_the_metrics_port(triton_llm):
    generate_stream(triton_llm.http_url, {"text_input": "Say hi.", "max_tokens": 3})
    generate_stream(triton_llm.http_url, {"payload": (ROOT / "clients/examples/record.json").read_text()},
                    model="risk_explainer_light")
    with urllib.request.urlopen(f"http://localhost:{triton_llm.metrics_port}/metrics", timeout=10) as response:
        served = {line.split("{")[0].removesuffix("_bucket") for line in response.read().decode().splitlines()
                  if line.startswith("s2t_")}
    rules = (PROMETHEUS / "llm_alerts.yml").read_text()
    panels = " ".join(t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"])
    named = _metric_names(rules) | _metric_names(panels)
    assert named and named <= served, named - served
