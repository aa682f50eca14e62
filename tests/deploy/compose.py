"""docker-compose.yml as Compose itself resolves it, and the Triton image's tag and pins: what the deployment
checks share."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from s2t.gate import runtime_imports
from s2t.gate.runtime_imports import normalised

COMPOSE_FILE = ROOT / "docker-compose.yml"


TRITON_IMAGE_DIR = ROOT / "deploy" / "triton"
# Where the image builds the public fronts (native/), which the keeper's --fronts names in every deployment.
IMAGE_FRONTS = "/opt/skill2triton/native"
TRITON_IMAGE_SOURCES = (TRITON_IMAGE_DIR, ROOT / "native", ROOT / "tools" / "debian_packages.sh")


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed; `make system` installs it (Debian package docker-compose)")
    return exe


def compose_config(tmp_path: Path, *, env: dict[str, str] | None = None, profiles: tuple[str, ...] = (),
                   files: tuple[Path, ...] = (COMPOSE_FILE,)) -> dict:
    """The resolved files, in a clean environment (no COMPOSE_* or port variables leaking in) and with an empty
    env file, so that a developer's `.env` cannot change the outcome."""
    exe = _docker_compose()
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    clean_env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", **(env or {})}
    cmd = [exe, "--project-directory", str(ROOT), "--env-file", str(env_file)]
    for file in files:
        cmd += ["-f", str(file)]
    for profile in profiles:
        cmd += ["--profile", profile]
    result = subprocess.run(cmd + ["config"], capture_output=True, text=True, env=clean_env, cwd=tmp_path,
                            timeout=60)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    # Warnings (unset variables, deprecated keys) go to stderr: the file should not need any.
    assert result.stderr.strip() == "", f"docker-compose config warned:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


# NGC's tritonserver release the images start from (25.07 is the first with the fixes for CVE-2025-23319/23320/23334)
# and the Python its stubs and the keeper run on (runtime_imports.IMAGE_PYTHON).
NGC_RELEASE = "25.08"
IMAGE_PYTHON = ".".join(map(str, runtime_imports.IMAGE_PYTHON))


def triton_image_tag() -> str:
    """The NGC release and a digest of the files the image is built from (deploy/triton, and native/ and the apt
    script for the in-process backend): a changed image is a new tag everywhere, so no host or cluster keeps running an old build
    under the current name."""
    digest = hashlib.sha256()
    files = (p for source in TRITON_IMAGE_SOURCES for p in (source.rglob("*") if source.is_dir() else [source]))
    for path in sorted(p for p in files if p.is_file()):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{NGC_RELEASE}-{digest.hexdigest()[:12]}"


IMAGE = f"skill2triton-tritonserver:{triton_image_tag()}"


def dockerfile_stages(dockerfile: Path) -> dict[str, tuple[str, str]]:
    """stage name -> (what it starts FROM, the text of its instructions)."""
    stages, current = {}, None
    for line in dockerfile.read_text().splitlines():
        found = re.fullmatch(r"FROM (\S+) AS (\S+)", line.strip())
        if found:
            current = found.group(2)
            stages[current] = (found.group(1), "")
        elif current and not line.lstrip().startswith("#"):
            stages[current] = (stages[current][0], stages[current][1] + line + "\n")
    return stages


def image_pins(dockerfile: Path, target: str) -> dict[str, str]:
    """distribution -> version that the target stage (and the stages it builds on) installs: pins on its RUN
    lines and in the requirement files it copies in and installs with -r."""
    stages = dockerfile_stages(dockerfile)
    pins: dict[str, str] = {}
    while target in stages:
        base, text = stages[target]
        for name in re.findall(r"-r \S*/([\w.-]+\.txt)", text):
            pins |= pinned_versions(re.sub(r"#.*", "", (dockerfile.parent / name).read_text()))
        pins |= pinned_versions(text)
        target = base
    return {normalised(name): version for name, version in pins.items()}


def pinned_versions(text: str) -> dict[str, str]:
    return {re.sub(r"\[.*\]", "", name).lower(): version
            for name, version in re.findall(r"([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?)==([0-9][^\s\"]*)", text)}
