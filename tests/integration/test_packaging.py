"""The project as a package: a non-editable `pip install .` into a fresh virtual environment, with the core
dependencies only (no extra), gives an `s2t` that serves the built repository, while TensorFlow, tf2onnx and the
benchmark stack stay uninstalled. The wheel is built from the tracked files alone, so it must generate the wire
format's code itself and carry the Python-based onnxruntime backend."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, ROOT, free_port

RECORD = ROOT / "clients" / "examples" / "record.json"
# Modules of the extras: none may be importable after the core install.
EXTRA_MODULES = ("tensorflow", "tf2onnx", "keras", "sklearn", "fastapi", "locust", "matplotlib", "xllamacpp",
                 "pytest")


def tracked_tree(dest: Path) -> Path:
    """The checkout as a fresh clone has it: tracked files only (no generated wire code, no built models)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


# Wheels of the core dependencies and of the build requirements, kept between runs (as pip's own cache would be, but
# that one stores nothing from this index): the install below is offline, so every run pays for unpacking the
# wheels, not for downloading them. The wheels are what pip resolved from constraints.txt and the project's metadata;
# a requirement the wheelhouse lacks makes the offline install fail, and the wheelhouse is filled again.
WHEELHOUSE = Path(os.environ.get("S2T_TEST_WHEELHOUSE") or Path.home() / ".cache" / "skill2triton" / "wheelhouse")


def pip(venv: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """This interpreter's pip acting on `venv` (`--python`): the fresh venv is made without pip of its own, which
    would only cost installing pip into it."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args, "--quiet",
                           "--disable-pip-version-check"],
                          cwd=venv.parent, capture_output=True, text=True, timeout=timeout)


def fill_wheelhouse(venv: Path, source: Path) -> None:
    """Download (online) the wheels of the core dependencies and of the build requirements; each wheel is moved
    in whole, so that another run reading the wheelhouse at the same time never sees half of one."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".filling-", dir=WHEELHOUSE.parent))
    try:
        constraints = ("-c", str(source / "constraints.txt"))
        build_requirements = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]["requires"]
        for args in (("wheel", "-w", str(staging), *constraints, str(source)),
                     ("download", "-d", str(staging), *constraints, *build_requirements)):
            done = pip(venv, *args)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for wheel in staging.glob("*.whl"):
            if not wheel.name.startswith("skill2triton-"):  # the project itself is built afresh every run
                os.replace(wheel, WHEELHOUSE / wheel.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install_offline(venv: Path, source: Path, dist: Path) -> subprocess.CompletedProcess:
    """What `pip install SOURCE` does (build the wheel in an isolated environment, resolve the core dependencies,
    install), with the wheelhouse as the only index; no byte-compiling of the dependencies beforehand."""
    offline = ("--no-index", "--find-links", str(WHEELHOUSE))
    shutil.rmtree(dist, ignore_errors=True)
    built = pip(venv, "wheel", "--no-deps", "-w", str(dist), *offline, str(source))
    if built.returncode != 0:
        return built
    return pip(venv, "install", "--no-compile", *offline, "-c", str(source / "constraints.txt"),
               *map(str, dist.glob("skill2triton-*.whl")))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv (this interpreter's base Python, no pip) with a non-editable install of the tracked files and the
    core dependencies, run from outside any checkout."""
    root = tmp_path_factory.mktemp("package")
    source = tracked_tree(root / "source")
    assert not list((source / "s2t" / "wire").glob("*_pb2*.py")), "the copy holds generated code"
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    install = install_offline(venv, source, root / "dist")
    if install.returncode != 0:  # a new requirement (or a first run): download once, then the same offline install
        fill_wheelhouse(venv, source)
        install = install_offline(venv, source, root / "dist")
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    shutil.rmtree(source)  # what follows runs from the installed package only
    return root, venv


def in_venv(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_core_install_leaves_out_tensorflow_and_every_other_extra(installed):
    root, venv = installed
    probe = in_venv(venv, "import importlib.util, json; "
                          f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {EXTRA_MODULES!r}}}))",
                    root)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {module: False for module in EXTRA_MODULES}


def test_installed_package_is_this_project_with_its_generated_wire_format(installed):
    root, venv = installed
    probe = in_venv(venv, "import s2t.cli, s2t.wire.skill_pb2, s2t.wire.skill_pb2_grpc, s2t.wire.tf_example_pb2, s2t.wire.skill_call, "
                          "s2t.backends, s2t.legacy.service, s2t.gateway.skill_gateway, s2t.gateway.dual_run, s2t.gateway.triton_infer; "
                          "from pathlib import Path; "
                          "print(Path(s2t.cli.__file__).parent.parent); "
                          "print((Path(s2t.backends.__file__).parent / 'runtime' / 'onnxruntime' / 'model.py').is_file())", root)
    assert probe.returncode == 0, probe.stderr
    location, backend = probe.stdout.split()
    assert "site-packages" in location and backend == "True"
    version = subprocess.run([str(venv / "bin" / "s2t"), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("s2t "), version.stderr


def wait_ready(http_port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "s2t serve exited before it was ready"
        try:
            with urllib.request.urlopen(f"http://localhost:{http_port}/v2/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready within {timeout} s")


def test_installed_s2t_serves_the_built_repository_without_tensorflow(installed):
    root, venv = installed
    work = root / "work"
    shutil.copytree(MODEL_REPOSITORY, work / "model_repository", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ENSEMBLES, work / "ensembles", ignore=shutil.ignore_patterns("__pycache__"))
    http_port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    log = (root / "serve.log").open("wb")
    server = subprocess.Popen(
        [str(venv / "bin" / "s2t"), "serve", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
         f"--metrics-port={free_port()}", "--supervisor-port=0", "--exit-timeout=5"],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(http_port, server)
        for protocol in (f"--http-url=localhost:{http_port}", f"--grpc-url=localhost:{grpc_port}"):
            score = subprocess.run([str(venv / "bin" / "s2t"), "score", str(RECORD), protocol], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=120)
            assert score.returncode == 0, score.stderr
            answer = json.loads(score.stdout)
            assert answer["request_id"] == "r-1" and 0.0 <= answer["probability"] <= 1.0
            assert answer["decision"] in ("APPROVE", "REVIEW", "DECLINE"), answer
        # The protobuf form: the adapter inside the server decodes it with the wheel's generated wire code.
        protobuf = in_venv(venv, (
            "import json, sys, numpy as np, tritonclient.http as http; "
            "from s2t.clients.legacy_record import encode; "
            f"record = json.load(open({str(RECORD)!r})); "
            f"client = http.InferenceServerClient('localhost:{http_port}'); "
            "payload = http.InferInput('payload', [1, 1], 'BYTES'); "
            "payload.set_data_from_numpy(np.array([[encode(record, 'protobuf')]], dtype=object)); "
            "result = client.infer('risk_pipeline', [payload]); "
            "print(result.as_numpy('decision').ravel()[0].decode())"), work)
        assert protobuf.returncode == 0, protobuf.stderr
        assert protobuf.stdout.strip() == answer["decision"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            log.close()
    assert code == 0, (root / "serve.log").read_text()[-3000:]
