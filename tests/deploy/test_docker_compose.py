"""docker-compose.yml (and the TLS override) as Compose itself resolves them (`docker-compose config`): offline,
no Docker engine needed. The Prometheus rules and the Grafana dashboard are checked in test_observability.py.

What cannot be checked here (the NGC image itself: its onnxruntime backend, its Python 3.12 site directory,
curl) is the job of a run on a Docker host.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.compose import (COMPOSE_FILE, IMAGE, IMAGE_FRONTS, IMAGE_PYTHON, NGC_RELEASE, TRITON_IMAGE_DIR,
                                  compose_config, dockerfile_stages, image_pins, pinned_versions)
from s2t.gate.runtime_imports import normalised

TLS_FILE = ROOT / "docker-compose.tls.yml"
TRITON_SERVICES = ("triton", "triton-gpu")
PTH_FILE = ROOT / "deploy" / "skill2triton.pth"
NGC_IMAGE = f"nvcr.io/nvidia/tritonserver:{NGC_RELEASE}-py3"
PTH_TARGET = f"/usr/local/lib/python{IMAGE_PYTHON}/dist-packages/skill2triton.pth"
PORT_OVERRIDES = {"HTTP_PORT": "18000", "GRPC_PORT": "18001", "METRICS_PORT": "18002", "SUPERVISOR_PORT": "18003"}
# What the container listens on, whatever the host side is.
CONTAINER_PORTS = {"HTTP_PORT": 8000, "GRPC_PORT": 8001, "METRICS_PORT": 8002, "SUPERVISOR_PORT": 8003}


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def gpu_config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), profiles=("gpu",))


@pytest.fixture(scope="module")
def all_profiles_config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), profiles=("gpu", "load", "llm"))


@pytest.fixture(scope="module")
def tls_config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), profiles=("gpu", "llm"), files=(COMPOSE_FILE, TLS_FILE))


def _services(config: dict) -> dict:
    return config["services"]


def _tritons(config: dict) -> dict:
    return {name: s for name, s in _services(config).items() if name in TRITON_SERVICES}


def _host_ports(service: dict) -> dict[int, int]:
    """container port -> host port, from either the long or the short form Compose prints."""
    return {container: host for container, (_, host) in _published(service).items()}


def _published(service: dict) -> dict[int, tuple[str, int]]:
    """container port -> (host address, host port); the address is "" when every interface listens."""
    ports = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports[int(port["target"])] = (port.get("host_ip", ""), int(port["published"]))
        else:
            # [host_ip:]host_port:container_port[/protocol]
            *host, container = str(port).split("/")[0].split(":")
            ports[int(container)] = (host[0] if len(host) == 2 else "", int(host[-1]))
    return ports


def _binds(service: dict) -> list[dict]:
    """Bind mounts as {source, target, read_only}, from either the long or the short form (named volumes left out)."""
    binds = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type", "bind") != "bind":
                continue
            binds.append({"source": volume["source"], "target": volume["target"],
                          "read_only": bool(volume.get("read_only"))})
        else:
            source, target, *mode = str(volume).split(":")
            binds.append({"source": source, "target": target, "read_only": "ro" in mode[:1]})
    return binds


def _seconds(duration: str | int) -> float:
    if isinstance(duration, (int, float)):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"unreadable duration {duration!r}"
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _flag(command: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} should be given once in {command}"
    return values[0]


def _served_repositories(service: dict) -> list[Path]:
    mounts = {b["target"]: Path(b["source"]) for b in _binds(service)}
    return [mounts[arg.split("=", 1)[1]] for arg in service["command"] if arg.startswith("--model-repository=")]


def test_the_triton_image_is_a_patched_ngc_release_with_the_models_packages_tagged_by_its_content(
        all_profiles_config):
    # 25.07 (Triton 2.59.1) fixed CVE-2025-23319/23320/23334; no older release may come back.
    assert tuple(map(int, NGC_RELEASE.split("."))) >= (25, 7)
    targets = {"triton": "serving", "triton-gpu": "serving", "triton-llm": "llm"}
    services = _services(all_profiles_config)
    assert dockerfile_stages(TRITON_IMAGE_DIR / "Dockerfile")["serving"][0] == NGC_IMAGE
    for name, target in targets.items():
        service = services[name]
        # The repository: the in-process backend is built in the image from native/.
        assert Path(service["build"]["context"]) == ROOT, name
        assert Path(service["build"]["context"]) / service["build"]["dockerfile"] == TRITON_IMAGE_DIR / "Dockerfile"
        assert service["build"]["target"] == target, name
        assert service["image"] == IMAGE + ("" if target == "serving" else f"-{target}"), \
            f"{name}: deploy/triton changed, so its tag must (here and in deploy/kubernetes): {IMAGE}"
    # The public fronts and their hook, built where the keeper's --fronts looks for them.
    serving = dockerfile_stages(TRITON_IMAGE_DIR / "Dockerfile")["serving"][1]
    for script in ("build_grpc_front.sh", "build_http_front.sh"):
        assert f"native/{script} {IMAGE_FRONTS}" in serving, script


def test_every_module_the_served_python_models_import_is_installed_by_their_image(all_profiles_config):
    from s2t.gate.runtime_imports import BACKEND_MODULES, distribution_of, model_files, third_party_modules

    services = _services(all_profiles_config)
    for name in ("triton", "triton-gpu", "triton-llm"):
        service = services[name]
        installed = image_pins(TRITON_IMAGE_DIR / "Dockerfile", service["build"]["target"])
        imported = third_party_modules(ROOT, model_files(_served_repositories(service)))
        assert {"onnxruntime", "numpy"} <= {m.split(".")[0] for m in imported}, "the scan found nothing"
        for module, importers in sorted(imported.items()):
            if module.split(".")[0] in BACKEND_MODULES:
                continue
            distribution = distribution_of(module)
            where = sorted(str(p.relative_to(ROOT)) for p in importers)
            assert distribution is not None, f"{module} (imported by {where}) is installed nowhere here either"
            assert distribution in installed, \
                f"{name}: {module} (from {distribution}, imported by {where}) is not installed by its image"


def test_the_image_installs_the_versions_of_constraints_txt():
    constraints = {normalised(name): version for name, version in pinned_versions((ROOT / "constraints.txt").read_text()).items()}
    pins = image_pins(TRITON_IMAGE_DIR / "Dockerfile", "llm")
    assert pins["numpy"].startswith("1."), "numpy 2 corrupts the 2.51 python stub's tensors"
    for name, version in pins.items():
        expected = constraints.get(name, version)
        assert version == expected, f"deploy/triton pins {name}=={version}, expected {expected}"


def test_both_repositories_are_on_the_command_line_in_poll_mode(config):
    command = _services(config)["triton"]["command"]
    assert isinstance(command, list), "the command should be a list, so nothing is split by a shell"
    assert command[0] == "tritonserver"
    repositories = [arg.split("=", 1)[1] for arg in command if arg.startswith("--model-repository=")]
    assert repositories == ["/models/model_repository", "/models/ensembles"]
    assert _flag(command, "model-control-mode") == "poll"
    assert _flag(command, "strict-readiness") == "true"


def test_every_triton_keeps_the_latency_summaries_s2t_serve_keeps_with_the_flag(all_profiles_config, tls_config):
    # The p99 alert and panel read them; the quantiles are the ones `s2t serve --latency-summaries` keeps (Triton's
    # own default set costs more on the model's thread).
    from s2t.serve.triton_server import LATENCY_SUMMARY_ARGS
    for config in (all_profiles_config, tls_config):
        for name, service in _tritons(config).items():
            assert [a for a in service["command"] if a.startswith("--metrics-config=")] == LATENCY_SUMMARY_ARGS, name


def test_the_native_onnxruntime_backend_is_used_not_the_local_stand_in(config):
    service = _services(config)["triton"]
    assert not any(arg.startswith("--backend-directory") for arg in service["command"])
    assert not any(b["target"].startswith("/opt/tritonserver/backends") for b in _binds(service))


def test_the_host_ports_default_to_8000_8001_8002(config):
    assert _host_ports(_services(config)["triton"]) == {8000: 8000, 8001: 8001, 8002: 8002, 8003: 8003}


def test_the_host_ports_follow_http_port_grpc_port_and_metrics_port(tmp_path):
    resolved = compose_config(tmp_path, env=PORT_OVERRIDES, profiles=("gpu",))
    expected = {CONTAINER_PORTS[var]: int(port) for var, port in PORT_OVERRIDES.items()}
    for name, service in _tritons(resolved).items():
        assert _host_ports(service) == expected, name


def test_the_pth_file_puts_the_mounted_repository_on_the_stub_python_path(config):
    binds = {b["target"]: b for b in _binds(_services(config)["triton"])}
    assert PTH_TARGET in binds, f"no mount onto {PTH_TARGET}"
    assert Path(binds[PTH_TARGET]["source"]) == PTH_FILE
    lines = [line for line in PTH_FILE.read_text().splitlines() if line.strip()]
    assert len(lines) == 1, f"{PTH_FILE} should hold one path, holds {lines}"
    repo_mount = binds.get(lines[0])
    assert repo_mount is not None, f"{PTH_FILE} names {lines[0]}, which no mount provides"
    assert Path(repo_mount["source"]) == ROOT
    assert (ROOT / "backends" / "__init__.py").exists() and (ROOT / "clients" / "__init__.py").exists()


def test_every_mount_comes_from_the_repository_exists_and_is_read_only(all_profiles_config):
    for name, service in _services(all_profiles_config).items():
        binds = _binds(service)
        assert binds, name
        for bind in binds:
            source = Path(bind["source"])
            assert source == ROOT or ROOT in source.parents, f"{name}: {source} is outside the repository"
            assert source.exists(), f"{name}: {source} does not exist in the repository"
            assert bind["read_only"], f"{name}: {bind['target']} is writable"


def test_both_tritons_mount_the_two_repositories(config, gpu_config):
    for name, service in {**_tritons(config), **_tritons(gpu_config)}.items():
        targets = {b["target"]: Path(b["source"]) for b in _binds(service)}
        assert targets["/models/model_repository"] == ROOT / "model_repository"
        assert targets["/models/ensembles"] == ROOT / "ensembles"


def test_the_healthcheck_asks_for_readiness_on_the_container_http_port(config):
    health = _services(config)["triton"]["healthcheck"]
    assert health["test"][:2] == ["CMD", "curl"]
    assert "http://localhost:8000/v2/health/ready" in health["test"]
    # Without --fail curl exits 0 on the 400 of a server that is up but not ready.
    assert any(arg == "--fail" or re.fullmatch(r"-[a-zA-Z]*f[a-zA-Z]*", arg) for arg in health["test"])


def test_the_grace_period_outlasts_the_exit_timeout_so_in_flight_requests_drain(config):
    service = _services(config)["triton"]
    exit_timeout = float(_flag(service["command"], "exit-timeout-secs"))
    assert _seconds(service["stop_grace_period"]) > exit_timeout
    assert service["restart"] == "unless-stopped"


def test_shared_memory_is_larger_than_docker_default_for_the_python_backend(config):
    shm = str(_services(config)["triton"]["shm_size"]).lower()
    number, unit = re.fullmatch(r"(\d+)([kmg]?)b?", shm).groups()
    assert int(number) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit] > 64 * 2**20


def test_the_gpu_profile_service_reserves_one_nvidia_gpu(gpu_config):
    service = _services(gpu_config)["triton-gpu"]
    assert service["profiles"] == ["gpu"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    assert devices[0]["driver"] == "nvidia"
    assert int(devices[0]["count"]) == 1
    assert "gpu" in devices[0]["capabilities"]


def test_the_gpu_service_differs_from_the_cpu_one_only_by_the_gpu_and_the_gpu_repository(gpu_config):
    services = _services(gpu_config)
    cpu, gpu = services["triton"], services["triton-gpu"]
    extras = ("profiles", "deploy", "networks", "command", "volumes")
    assert not {"profiles", "deploy", "networks"} & set(cpu)
    assert {k: v for k, v in gpu.items() if k not in extras} == {k: v for k, v in cpu.items() if k not in extras}
    assert gpu["command"] == cpu["command"] + ["--model-repository=/models/model_repository_gpu"]
    extra_mounts = [v for v in gpu["volumes"] if v not in cpu["volumes"]]
    assert all(v in gpu["volumes"] for v in cpu["volumes"])
    assert [(Path(v["source"]), v["target"], v["read_only"]) for v in extra_mounts] == [
        (ROOT / "model_repository_gpu", "/models/model_repository_gpu", True)]


MONITORING_IMAGES = {"prometheus": "prom/prometheus", "grafana": "grafana/grafana", "locust": "locustio/locust"}
LOCUST_DOCKERFILE = ROOT / "deploy" / "locust" / "Dockerfile"


def _base_image(service: dict) -> str:
    """The image, or the FROM of the Dockerfile the service is built from."""
    if "build" not in service:
        return service["image"]
    dockerfile = Path(service["build"]["context"]) / service["build"].get("dockerfile", "Dockerfile")
    return next(line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("FROM "))


def test_prometheus_grafana_and_locust_images_are_pinned_to_a_release(all_profiles_config):
    services = _services(all_profiles_config)
    for name, repository in MONITORING_IMAGES.items():
        image, _, tag = _base_image(services[name]).partition(":")
        assert image == repository, name
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {tag!r} is not a release tag"


def test_the_locust_image_adds_what_the_locustfile_imports_at_the_project_pins(all_profiles_config):
    import ast

    from s2t.project_imports import PROJECT_PACKAGES, project_files
    locust = _services(all_profiles_config)["locust"]
    assert Path(locust["build"]["context"]) == LOCUST_DOCKERFILE.parent
    installed = pinned_versions(LOCUST_DOCKERFILE.read_text())
    constraints = pinned_versions((ROOT / "constraints.txt").read_text())
    assert installed and all(constraints[name] == version for name, version in installed.items()), installed
    assert _base_image(locust) == f"locustio/locust:{constraints['locust']}"
    # Third-party modules the locustfile and the project modules it imports need, beyond locust's own.
    locustfile = ROOT / "s2t" / "bench" / "load" / "locustfile.py"
    modules = set()
    for source in [locustfile, *project_files(ROOT, [locustfile])]:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module.split(".")[0])
    provided = {"locust", "gevent", "grpc", "google", "numpy", "tritonclient", "geventhttpclient", "orjson"}
    third_party = {m for m in modules if m not in sys.stdlib_module_names and m not in PROJECT_PACKAGES}
    assert third_party <= provided, third_party - provided
    assert {"numpy", "tritonclient"} <= set(installed)


def test_the_monitoring_ports_listen_on_localhost_only(all_profiles_config):
    services = _services(all_profiles_config)
    for name in MONITORING_IMAGES:
        published = _published(services[name])
        assert published, name
        assert {address for address, _ in published.values()} == {"127.0.0.1"}, name


def test_the_monitoring_host_ports_follow_prometheus_port_grafana_port_and_locust_port(tmp_path):
    env = {"PROMETHEUS_PORT": "19090", "GRAFANA_PORT": "13000", "LOCUST_PORT": "18089"}
    services = _services(compose_config(tmp_path, env=env, profiles=("load",)))
    assert _host_ports(services["prometheus"]) == {9090: 19090}
    assert _host_ports(services["grafana"]) == {3000: 13000}
    assert _host_ports(services["locust"]) == {8089: 18089}


def test_prometheus_scrapes_the_metrics_port_of_whichever_triton_runs(gpu_config):
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "triton")
    assert [t for c in job["static_configs"] for t in c["targets"]] == [f"triton:{CONTAINER_PORTS['METRICS_PORT']}"]
    aliases = _services(gpu_config)["triton-gpu"]["networks"]["default"]["aliases"]
    assert "triton" in aliases, "the GPU service must answer to `triton` too"
    binds = {b["target"]: Path(b["source"]) for b in _binds(_services(gpu_config)["prometheus"])}
    assert binds["/etc/prometheus"] == ROOT / "deploy" / "prometheus"
    assert "--config.file=/etc/prometheus/prometheus.yml" in _services(gpu_config)["prometheus"]["command"]


def test_grafana_provisions_the_datasource_and_the_dashboard_folder_it_mounts(config):
    binds = {b["target"]: Path(b["source"]) for b in _binds(_services(config)["grafana"])}
    provisioning = binds["/etc/grafana/provisioning"]
    assert provisioning == ROOT / "deploy" / "grafana" / "provisioning"
    providers = yaml.safe_load((provisioning / "dashboards" / "skill2triton.yml").read_text())["providers"]
    dashboards = binds[providers[0]["options"]["path"]]
    assert (dashboards / "skill2triton.json").is_file()
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in _services(config)


def test_locust_starts_only_on_demand_aimed_at_triton_with_the_repository_locustfile(all_profiles_config):
    locust = _services(all_profiles_config)["locust"]
    # A service with a profile is left out of a plain `up`: no load generator starts with the stack.
    assert locust["profiles"] == ["load"]
    command = locust["command"]
    assert "--host=http://triton:8000" in command
    locustfile = Path(command[command.index("-f") + 1])
    mount = next(b for b in _binds(locust) if locustfile.is_relative_to(b["target"]))
    assert (Path(mount["source"]) / locustfile.relative_to(mount["target"])) == ROOT / "s2t" / "bench" / "load" / "locustfile.py"
    assert (ROOT / "s2t" / "bench" / "load" / "locustfile.py").is_file(), "s2t/bench/load/locustfile.py is missing"


TLS_FLAGS = ["--grpc-use-ssl=true", "--grpc-server-cert=/run/secrets/triton_grpc_cert",
             "--grpc-server-key=/run/secrets/triton_grpc_key"]


def _target(volume: dict) -> str:
    return volume["target"]


def test_the_tls_override_adds_only_the_grpc_tls_flags_to_the_base_command(all_profiles_config, tls_config):
    # triton-llm too: its gRPC would otherwise stay plaintext under the override.
    for name in (*TRITON_SERVICES, "triton-llm"):
        base, tls = _services(all_profiles_config)[name], _services(tls_config)[name]
        assert tls["command"] == base["command"] + TLS_FLAGS, name
        # Compose merges mounts by target and may reorder them.
        assert sorted(tls["volumes"], key=_target) == sorted(base["volumes"], key=_target), name
        rest = ("command", "secrets", "volumes")
        assert {k: v for k, v in tls.items() if k not in rest} == {k: v for k, v in base.items() if k not in rest}
        assert sorted(s["source"] for s in tls["secrets"]) == ["triton_grpc_cert", "triton_grpc_key"]


def test_the_tls_secrets_default_to_the_gitignored_deploy_tls_and_follow_the_environment(tls_config, tmp_path):
    secrets = tls_config["secrets"]
    assert Path(secrets["triton_grpc_cert"]["file"]) == ROOT / "deploy" / "tls" / "server.crt"
    assert Path(secrets["triton_grpc_key"]["file"]) == ROOT / "deploy" / "tls" / "server.key"
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/tls/server.key"], cwd=ROOT)
    assert ignored.returncode == 0, "deploy/tls/ must be gitignored"
    moved = compose_config(tmp_path, files=(COMPOSE_FILE, TLS_FILE),
                           env={"TRITON_TLS_CERT": "/etc/ssl/triton.crt", "TRITON_TLS_KEY": "/etc/ssl/triton.key"})
    assert moved["secrets"]["triton_grpc_key"]["file"] == "/etc/ssl/triton.key"


def test_no_key_or_certificate_is_committed():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    material = [f for f in tracked.splitlines() if re.search(r"\.(key|pem|crt|p12|pfx)$", f)]
    assert material == []


@pytest.fixture
def self_signed(tmp_path) -> dict[str, Path]:
    """A certificate for localhost, made as the TLS override's comment says."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed; `make system` installs the project's system packages")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-sha256", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return {"/run/secrets/triton_grpc_cert": cert, "/run/secrets/triton_grpc_key": key}


def test_the_tls_flags_make_the_grpc_port_serve_over_tls_only(tls_config, self_signed, built_artifacts, tmp_path):
    """Run as the container runs it: the keeper hands Triton's TLS flags to the gRPC front on the public port."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
    from s2t.serve.triton_server import assemble_backend_dir, server_env

    service = dict(_services(tls_config)["triton"])
    service["command"] = [_replaced(arg, {s: str(p) for s, p in self_signed.items()}) for arg in service["command"]]
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "supervisor")}
    command = _embedded(service, {"/models/model_repository": MODEL_REPOSITORY, "/models/ensembles": ENSEMBLES},
                        assemble_backend_dir(tmp_path / "backends"), ports)
    with open(tmp_path / "keeper.log", "wb") as log:
        keeper = subprocess.Popen([*command, "--exit-timeout-secs=2"], cwd=ROOT, env=server_env(), stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        secure = grpcclient.InferenceServerClient(f"localhost:{ports['grpc']}", ssl=True,
                                                  root_certificates=str(self_signed["/run/secrets/triton_grpc_cert"]))
        assert _until(lambda: secure.is_server_ready(), 120), (tmp_path / "keeper.log").read_text()[-3000:]
        secure.close()
        plain = grpcclient.InferenceServerClient(f"localhost:{ports['grpc']}")
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        plain.close()
    finally:
        keeper.terminate()
        assert keeper.wait(60) == 0


def _replaced(arg: str, paths: dict[str, str]) -> str:
    for old, new in paths.items():
        arg = arg.replace(old, new)
    return arg


def _until(condition, timeout: float) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return True
        except Exception:  # noqa: BLE001 - not up yet, whatever the client says
            pass
        time.sleep(0.3)
    return False


def test_the_triton_services_run_tritonserver_under_the_keeper_with_its_port_published(all_profiles_config):
    services = _services(all_profiles_config)
    for name, service in {**_tritons(all_profiles_config), "triton-llm": services["triton-llm"]}.items():
        entrypoint = service["entrypoint"]
        assert entrypoint[0] == "/opt/nvidia/nvidia_entrypoint.sh", "the image's own entrypoint stays first"
        assert entrypoint[1:4] == ["python3", "-m", "s2t.serve.keeper"] and entrypoint[-1] == "--", name
        # The public ports are the fronts', built into the image where the keeper looks for them.
        assert f"--fronts={IMAGE_FRONTS}" in entrypoint, name
        assert (ROOT / "s2t" / "serve" / "keeper.py").is_file()
        assert _host_ports(service)[8003] == 8003, name
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "s2t-supervisor")
    assert job["static_configs"][0]["targets"] == ["triton:8003"]


# Options of the image's Triton (25.08) that the embedded 2.51 does not have.
OPTIONS_SINCE_2_59 = ("--http-max-input-size=",)


def test_every_triton_service_reads_no_request_larger_than_its_models_can_use(all_profiles_config):
    from s2t.serve.request_limits import http_max_input_bytes
    for name in ("triton", "triton-gpu", "triton-llm"):
        service = _services(all_profiles_config)[name]
        limit = http_max_input_bytes(_served_repositories(service))
        assert limit < 64 << 20, "below Triton's own default, or the option does nothing"
        assert _flag(service["command"], "http-max-input-size") == str(limit), name


def _embedded(service: dict, repositories: dict[str, Path], backend_dir: Path, ports: dict[str, int]) -> list[str]:
    """The service's entrypoint and command as this machine can run them: the wheel's tritonserver for the image's,
    `make native`'s fronts for the image's build of them, local folders for the mounts, free ports; nothing else
    changed."""
    from s2t.serve.triton_server import NATIVE_BUILD, TRITON_DIR
    keeper = [sys.executable if arg == "python3" else arg for arg in service["entrypoint"][1:]]
    keeper = [f"--fronts={NATIVE_BUILD}" if a == f"--fronts={IMAGE_FRONTS}" else a for a in keeper]
    keeper = [f"--supervisor-port={ports['supervisor']}" if a.startswith("--supervisor-port") else a for a in keeper]
    command = []
    for arg in service["command"]:
        if arg.startswith(OPTIONS_SINCE_2_59):
            continue  # the image's Triton knows it; the wheel's 2.51 would refuse to start
        if arg == "tritonserver":
            arg = str(TRITON_DIR / "bin" / "tritonserver")
        for target, source in repositories.items():
            arg = arg.replace(f"={target}", f"={source}")
        command.append(arg)
    command += [f"--backend-directory={backend_dir}", f"--http-port={ports['http']}",
                f"--grpc-port={ports['grpc']}", f"--metrics-port={ports['metrics']}"]
    return keeper + command


def test_the_compose_command_heals_a_dead_stub_and_leaves_no_stub_when_the_server_dies(config, built_artifacts,
                                                                                       tmp_path):
    import signal
    import time
    import urllib.request

    from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, free_port
    from s2t.serve.leftovers import SHM_DIR, regions_of
    from s2t.serve.supervisor import stubs_of
    from s2t.serve.triton_server import assemble_backend_dir, server_env

    repo = tmp_path / "models" / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "supervisor")}
    command = _embedded(_services(config)["triton"],
                        {"/models/model_repository": repo, "/models/ensembles": ENSEMBLES},
                        assemble_backend_dir(tmp_path / "backends"), ports)
    log_path = tmp_path / "keeper.log"

    def get(url: str) -> str:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.read().decode()

    def until(condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    with open(log_path, "wb") as log:
        keeper = subprocess.Popen(command, cwd=ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            assert until(lambda: "200" == str(urllib.request.urlopen(
                f"http://localhost:{ports['http']}/v2/health/ready", timeout=1).status), 120), log_path.read_text()
            server = int(Path(f"/proc/{keeper.pid}/task/{keeper.pid}/children").read_text().split()[0])
            state_file = repo.parent / ".model_repository.s2t" / "supervisor.json"
            # Written when supervision starts (the repository's control area, as /models/ is in the container).
            assert until(lambda: json.loads(state_file.read_text())["server_pid"] == server, 20)
            assert "s2t_server_restarts_total 0" in get(f"http://localhost:{ports['supervisor']}/metrics")
            # No admin key in the compose file: the keeper locks shared memory, logging and trace on both protocols.
            from tests.integration.serve.test_lifecycle import assert_locked
            assert_locked(f"localhost:{ports['http']}", f"localhost:{ports['grpc']}")
            victim = next(pid for pid, s in stubs_of(server).items() if s.model == "skill_adapter")
            os.kill(victim, signal.SIGKILL)
            reloaded = 's2t_supervisor_reloads_total{model="skill_adapter",reason="stub_died"} 1'
            assert until(lambda: reloaded in get(f"http://localhost:{ports['supervisor']}/metrics"), 20), \
                log_path.read_text()[-3000:]
            assert until(lambda: "skill_adapter" in {s.model for s in stubs_of(server).values()}, 20)
            assert json.loads(state_file.read_text())["reloads"] == [
                {"model": "skill_adapter", "reason": "stub_died", "count": 1}]
            stubs = list(stubs_of(server))
            regions = regions_of(stubs)
            assert regions
            os.kill(server, signal.SIGKILL)
            assert keeper.wait(30) != 0, "a dead server ends the container, so that it is restarted"
            time.sleep(1)
            assert not [pid for pid in stubs if Path(f"/proc/{pid}").exists()
                        and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
            # Nor a shared-memory region (the container's /dev/shm may outlive it: `restart` reuses the container).
            assert not [name for name in regions if (SHM_DIR / name).exists()]
        finally:
            if keeper.poll() is None:
                keeper.send_signal(signal.SIGTERM)
                keeper.wait(60)


def test_the_llm_service_publishes_the_openai_api_which_its_healthcheck_asks_and_no_other_service_serves(
        all_profiles_config, tmp_path):
    from s2t.serve.keeper import serves_openai_model
    services = _services(all_profiles_config)
    llm = services["triton-llm"]
    port = int(_flag(llm["entrypoint"], "openai-port"))
    assert serves_openai_model([str(p) for p in _served_repositories(llm)]), "the keeper would not start the API"
    assert _host_ports(llm) == {**{p: p for p in CONTAINER_PORTS.values()}, port: 9000}
    moved = _services(compose_config(tmp_path, env={"OPENAI_PORT": "19000"}, profiles=("llm",)))["triton-llm"]
    assert _host_ports(moved)[port] == 19000
    # /v1/models answers only while Triton is ready: the one check covers the API and the server behind it.
    test = llm["healthcheck"]["test"]
    assert test[:2] == ["CMD", "curl"] and "-f" in "".join(test[2:-1]) and \
        test[-1] == f"http://localhost:{port}/v1/models"
    for name, service in _tritons(all_profiles_config).items():
        assert not serves_openai_model([str(p) for p in _served_repositories(service)]), name
        assert port not in _host_ports(service), name


def test_the_llm_image_installs_what_the_keeper_imports_to_serve_the_openai_api(all_profiles_config):
    from s2t.gate.runtime_imports import distribution_of, third_party_modules
    installed = image_pins(TRITON_IMAGE_DIR / "Dockerfile", _services(all_profiles_config)["triton-llm"]["build"]["target"])
    imported = third_party_modules(ROOT, [ROOT / "s2t" / "serve" / "keeper.py"])
    assert "aiohttp" in imported, "the scan no longer reaches the OpenAI API"
    for module in imported:
        assert distribution_of(module) in installed, f"{module} is not installed by the llm image"
    # And everything aiohttp pulls in on the image's Python, each pinned (the image installs no unpinned package).
    from importlib.metadata import requires
    from packaging.requirements import Requirement
    environment = {"python_version": IMAGE_PYTHON, "python_full_version": f"{IMAGE_PYTHON}.0", "extra": "",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_python_implementation": "CPython",
                   "implementation_name": "cpython", "platform_machine": "x86_64"}
    todo, seen = ["aiohttp"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in installed, f"the llm image does not pin {name}, which the OpenAI API needs"
        for text in requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(normalised(requirement.name))
    assert {"yarl", "multidict", "idna"} <= seen
