"""docker-compose.yml as Compose itself resolves it (`docker-compose config`): offline, no Docker engine needed.

What cannot be checked here (the NGC image itself: its onnxruntime backend, its Python 3.10 site directory,
curl) is the job of a run on a Docker host.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
PTH_FILE = ROOT / "deploy" / "skill2triton.pth"
IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
PTH_TARGET = "/usr/local/lib/python3.10/dist-packages/skill2triton.pth"
PORT_OVERRIDES = {"HTTP_PORT": "18000", "GRPC_PORT": "18001", "METRICS_PORT": "18002"}
# What the container listens on, whatever the host side is.
CONTAINER_PORTS = {"HTTP_PORT": 8000, "GRPC_PORT": 8001, "METRICS_PORT": 8002}


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed; `make system` installs it (Debian package docker-compose)")
    return exe


def compose_config(tmp_path: Path, *, env: dict[str, str] | None = None, profiles: tuple[str, ...] = ()) -> dict:
    """The resolved file, in a clean environment (no COMPOSE_* or port variables leaking in) and with an empty
    env file, so that a developer's `.env` cannot change the outcome."""
    exe = _docker_compose()
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    clean_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", **(env or {})}
    cmd = [exe, "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), "--env-file", str(env_file)]
    for profile in profiles:
        cmd += ["--profile", profile]
    result = subprocess.run(cmd + ["config"], capture_output=True, text=True, env=clean_env, cwd=tmp_path,
                            timeout=60)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    # Warnings (unset variables, deprecated keys) go to stderr: the file should not need any.
    assert result.stderr.strip() == "", f"docker-compose config warned:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def gpu_config(tmp_path_factory) -> dict:
    return compose_config(tmp_path_factory.mktemp("compose"), profiles=("gpu",))


def _services(config: dict) -> dict:
    return config["services"]


def _host_ports(service: dict) -> dict[int, int]:
    """container port -> host port, from either the long or the short form Compose prints."""
    ports = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            ports[int(port["target"])] = int(port["published"])
        else:
            host, _, container = str(port).rpartition(":")
            ports[int(container)] = int(host.rpartition(":")[2])
    return ports


def _binds(service: dict) -> list[dict]:
    """Mounts as {source, target, read_only}, from either the long or the short form."""
    binds = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
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


def test_the_image_is_triton_24_10_the_release_of_the_pinned_tritonclient(config, gpu_config):
    for name, service in {**_services(config), **_services(gpu_config)}.items():
        assert service["image"] == IMAGE, name


def test_both_repositories_are_on_the_command_line_in_poll_mode(config):
    command = _services(config)["triton"]["command"]
    assert isinstance(command, list), "the command should be a list, so nothing is split by a shell"
    assert command[0] == "tritonserver"
    repositories = [arg.split("=", 1)[1] for arg in command if arg.startswith("--model-repository=")]
    assert repositories == ["/models/model_repository", "/models/ensembles"]
    assert _flag(command, "model-control-mode") == "poll"
    assert _flag(command, "strict-readiness") == "true"


def test_the_native_onnxruntime_backend_is_used_not_the_local_stand_in(config):
    service = _services(config)["triton"]
    assert not any(arg.startswith("--backend-directory") for arg in service["command"])
    assert not any(b["target"].startswith("/opt/tritonserver/backends") for b in _binds(service))


def test_the_host_ports_default_to_8000_8001_8002(config):
    assert _host_ports(_services(config)["triton"]) == {8000: 8000, 8001: 8001, 8002: 8002}


def test_the_host_ports_follow_http_port_grpc_port_and_metrics_port(tmp_path):
    resolved = compose_config(tmp_path, env=PORT_OVERRIDES, profiles=("gpu",))
    expected = {CONTAINER_PORTS[var]: int(port) for var, port in PORT_OVERRIDES.items()}
    for name, service in _services(resolved).items():
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
    assert (ROOT / "backends" / "__init__.py").exists()


def test_every_mount_comes_from_the_repository_exists_and_is_read_only(config, gpu_config):
    for name, service in {**_services(config), **_services(gpu_config)}.items():
        binds = _binds(service)
        assert binds, name
        for bind in binds:
            source = Path(bind["source"])
            assert source == ROOT or ROOT in source.parents, f"{name}: {source} is outside the repository"
            assert source.exists(), f"{name}: {source} does not exist in the repository"
            assert bind["read_only"], f"{name}: {bind['target']} is writable"
        targets = {b["target"]: Path(b["source"]) for b in binds}
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


def test_the_gpu_service_differs_from_the_cpu_one_only_by_the_gpu(gpu_config):
    services = _services(gpu_config)
    assert "profiles" not in services["triton"] and "deploy" not in services["triton"]
    gpu_only = {k: v for k, v in services["triton-gpu"].items() if k not in ("profiles", "deploy")}
    assert gpu_only == services["triton"]
