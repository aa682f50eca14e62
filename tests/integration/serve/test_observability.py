"""The Prometheus config, alert rules, Grafana dashboard and autoscaling rules against what Triton really exports.

promtool (from `make system`) checks the config and fires every alert on synthetic series (alerts.test.yml);
every metric, label and label value the queries name is looked up in the /metrics of a server started as
`make serve` starts it (`s2t serve`, its flags, with `--latency-summaries` as a deployment that uses the p99 alert
rule and panel runs it), after traffic through risk_pipeline, risk_router (with a shadow
candidate) and risk_stream. Series that only appear after an event (the breaker opening, a stream overflowing)
are created at zero when their model loads, so they are found here without the event.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
import yaml

from s2t.clients import stream_client
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, ROOT, S2T, free_port
from s2t.control.rollout import Rollout, canary
from s2t.control.version_store import VersionStore

PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "skill2triton.json"
LLM_DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "llm.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
ADAPTER = ROOT / "deploy" / "kubernetes" / "prometheus-adapter" / "config.yaml"
# Labels Prometheus attaches to every scraped series (job, instance) or a Kubernetes scrape adds (namespace, pod).
TARGET_LABELS = {"job", "instance", "namespace", "pod"}
# Series Prometheus makes itself rather than scrapes.
PROMETHEUS_SERIES = {"up"}
# Grafana fills these in; the test reads a variable's matcher as "this label exists".
DASHBOARD_VARIABLE = "$"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def _promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed; `make system` installs it (from Debian's prometheus package)")
    return exe


def _promtool_run(*args: str) -> None:
    result = subprocess.run([_promtool(), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_promtool_accepts_the_prometheus_config_and_its_rule_files():
    _promtool_run("check", "config", "prometheus.yml")


def test_promtool_accepts_the_alert_rules():
    _promtool_run("check", "rules", "alerts.yml")


def test_each_alert_fires_on_the_series_that_should_fire_it():
    _promtool_run("test", "rules", "alerts.test.yml")


def alert_rules() -> dict[str, str]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_queries() -> dict[str, list[str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in panels}


def adapter_queries() -> dict[str, str]:
    """Each rule's queries with the adapter's template filled in as it would for one pod."""
    queries = {}
    for rule in yaml.safe_load(ADAPTER.read_text())["rules"]:
        series = re.match(r"\w+", rule["seriesQuery"]).group()
        metrics = (rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", 'pod="p"')
                   .replace("<<.GroupBy>>", "pod"))
        queries[rule["name"]["as"]] = rule["seriesQuery"] + " + " + metrics
    return queries


def test_the_alerts_cover_queue_depth_failures_p99_latency_the_breaker_stream_gaps_and_healing():
    assert {"TritonQueueDepthHigh", "TritonFailureRatioHigh", "TritonP99LatencyHigh", "RouterBreakerOpen",
            "StreamGapsHigh", "FeatureDrift", "ModelGivenUp", "TritonHung", "TritonRestarted"} <= set(alert_rules())


def test_the_dashboard_shows_throughput_latency_queue_batches_canary_shadow_and_reordering():
    assert {"Throughput", "Latency", "Queue", "Batch size", "Canary split", "Shadow differences",
            "Stream reordering", "Feature drift (PSI)"} <= set(dashboard_queries())


def variables(dashboard: Path) -> dict[str, dict]:
    return {variable["name"]: variable for variable in json.loads(dashboard.read_text())["templating"]["list"]}


@pytest.mark.parametrize("dashboard", [DASHBOARD, LLM_DASHBOARD], ids=lambda path: path.name)
def test_the_dashboard_reads_its_datasource_variable_which_defaults_to_the_provisioned_one(dashboard):
    uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    datasource = variables(dashboard)["datasource"]
    assert (datasource["type"], datasource["query"], datasource["current"]["value"]) == ("datasource", "prometheus", uid)
    for panel in json.loads(dashboard.read_text())["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(target.get("datasource", panel["datasource"])["uid"] == "${datasource}"
                   for target in panel["targets"]), panel["title"]


@pytest.mark.parametrize("dashboard", [DASHBOARD, LLM_DASHBOARD], ids=lambda path: path.name)
def test_every_panel_with_a_model_label_follows_the_model_variable(dashboard):
    model = variables(dashboard)["model"]
    assert model["query"]["query"].startswith("label_values(") and model["includeAll"] and model["multi"]
    for panel in json.loads(dashboard.read_text())["panels"]:
        for target in panel["targets"]:
            if re.search(r"by \([^)]*\bmodel\b", target["expr"]):
                names = selectors(target["expr"])[0]
                filtered = {name for name, label, operator, value in selectors(target["expr"])[1]
                            if (label, operator, value) == ("model", "=~", "$model")}
                assert names <= filtered, f"{panel['title']}: {target['expr']}"


# --- the names against a live server -------------------------------------------------------------------------

def selectors(expr: str) -> tuple[set[str], list[tuple[str, str, str, str]], set[str]]:
    """Metric names, label matchers (metric, label, operator, value) and grouping labels of a PromQL expression."""
    matchers = [(m.group(1), *matcher) for m in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", expr)
                for matcher in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m.group(2))]
    grouping = {label.strip() for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr)
                for label in m.group(1).split(",") if label.strip()}
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    names = {m.group() for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][\w:]*", bare)
             if m.group().lower() not in PROMQL_WORDS and not bare[m.end():].lstrip().startswith("(")}
    return names, matchers, grouping


@pytest.mark.parametrize("expr, names", [
    ('sum by (model) (rate(nv_inference_count{model="a"}[1m])) / 1e3', {"nv_inference_count"}),
    ("histogram_quantile(0.99, sum by (candidate, le) (rate(x_bucket[5m])))", {"x_bucket"}),
    ("up == 0 and on (instance) y > bool 1", {"up", "y"}),
])
def test_selectors_find_the_metric_names_of_an_expression(expr, names):
    assert selectors(expr)[0] == names


def parse_metrics(text: str) -> dict[str, list[dict[str, str]]]:
    series: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? \S+$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            series.setdefault(m.group(1), []).append(labels)
    return series


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/v2/health/ready", timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def exported(built_artifacts, german_credit_data, tmp_path_factory) -> dict[str, list[dict[str, str]]]:
    """Every series `s2t serve` exports (Triton's and its supervisor's) after traffic on each entry model, with a
    shadow candidate (which the session server does not have) on a copy of the repository."""
    root = tmp_path_factory.mktemp("observed")
    repo = root / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    lite = VersionStore(repo).served("risk_scorer_lite")[-1]
    canary(Rollout("risk_scorer_lite", repo), lite, 0.0, 100.0)
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port()}
    supervisor_port = free_port()
    env = {**os.environ, **{name: str(port) for name, port in ports.items()}}
    log_path = root / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(S2T), "serve", "--exit-timeout", "5", "--latency-summaries",
                                    "--supervisor-port", str(supervisor_port),
                                    "--model-repository", str(repo), "--model-repository", str(ENSEMBLES)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # `s2t serve` says `ready:` once its own parts (the supervisor's metrics among them) run too, which can be
        # a moment after Triton reports ready on a busy machine.
        deadline = time.monotonic() + 120
        while not (_ready(ports["HTTP_PORT"]) and "\nready: " in "\n" + log_path.read_text(errors="replace")):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.3)
        http_url, grpc_url = f"localhost:{ports['HTTP_PORT']}", f"localhost:{ports['GRPC_PORT']}"
        rows = german_credit_data.records()
        client = http.InferenceServerClient(http_url)
        payloads = np.array([[json.dumps({"request_id": f"o-{i}", "features": rows[i]}).encode()]
                             for i in range(50)], dtype=object)
        for model in ("risk_pipeline", "risk_router"):
            tensor = http.InferInput("payload", list(payloads.shape), "BYTES")
            tensor.set_data_from_numpy(payloads)
            client.infer(model, [tensor])
        client.close()
        stream_client.replay(grpc_url, [{"features": f} for f in rows[:60]], 3, shuffle=0.3, window=4, seed=5)
        with urllib.request.urlopen(f"http://localhost:{ports['METRICS_PORT']}/metrics", timeout=10) as resp:
            exported = parse_metrics(resp.read().decode())
        # The supervisor's own series (Prometheus' s2t-supervisor job), once it has read Triton's counters.
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(f"http://localhost:{supervisor_port}/metrics", timeout=10) as resp:
                supervisor = parse_metrics(resp.read().decode())
            if "s2t_supervisor_given_up" in supervisor or time.monotonic() > deadline:
                return {**exported, **supervisor}
            time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


QUERIES = ([(f"alert {name}", expr) for name, expr in alert_rules().items()]
           + [(f"panel {title}", expr) for title, exprs in dashboard_queries().items() for expr in exprs]
           + [(f"adapter {name}", expr) for name, expr in adapter_queries().items()])


@pytest.mark.parametrize("where, expr", QUERIES, ids=[where for where, _ in QUERIES])
def test_every_query_names_metrics_labels_and_values_the_server_exports(exported, where, expr):
    names, matchers, grouping = selectors(expr)
    assert names, f"{where}: no metric found in {expr!r}"
    for name in names - PROMETHEUS_SERIES:
        assert name in exported, f"{where}: {name} is not exported"
    for name, label, operator, value in matchers:
        if label in TARGET_LABELS or name in PROMETHEUS_SERIES:
            continue
        values = {series.get(label) for series in exported[name]} - {None}
        assert values, f"{where}: {name} has no label {label!r}"
        if DASHBOARD_VARIABLE in value:
            continue
        if operator == "=":
            assert value in values, f"{where}: {name}{{{label}}} is never {value!r} (seen: {sorted(values)})"
        elif operator == "=~":
            # The queries' regexes are plain alternations: each alternative must be a value that occurs.
            missing = set(value.split("|")) - values
            assert not missing, f"{where}: {name}{{{label}}} is never {sorted(missing)}"
    labels_of_names = {label for name in names - PROMETHEUS_SERIES for series in exported[name] for label in series}
    assert grouping <= labels_of_names | TARGET_LABELS, f"{where}: grouped by unknown {grouping - labels_of_names}"
