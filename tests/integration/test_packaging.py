"""The project as a package: a non-editable `pip install .` into a fresh virtual environment, with the core
dependencies only (no extra), gives an `s2t` that serves the built repository, while TensorFlow, tf2onnx and the
benchmark stack stay uninstalled. The wheel is built from the tracked files alone, so it must generate the wire
format's code itself and carry the Python-based onnxruntime backend."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
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


# The native parts the wheel build compiles (setup.py runs native/*.sh into the build folder's s2t/serve/native),
# kept between runs under a key of everything they are built from: the tracked native sources and build scripts,
# setup.py, the system's packages (compilers, gRPC, protobuf, libevent) and the Python they link. The compile was most
# of this module's minute and a half; a run whose inputs match a kept build hands the build scripts its products,
# which they find newer than every source and leave as they are, so the wheel still carries (and the serving test
# still runs) exactly what setup.py builds from the tracked files. Without a kept build, the checkout's own (`make
# native`, from the same inputs) is handed over the same way; any other input compiles from scratch, and is kept.
NATIVE_CACHE = WHEELHOUSE.parent / "wheel-native"


def native_inputs_key(source: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in (source / "native").rglob("*")
                   if p.is_file() and "fuzz" not in p.relative_to(source).parts)
    for path in [source / "setup.py", *files]:
        digest.update(f"{path.relative_to(source)}\0".encode() + path.read_bytes() + b"\0")
    for command in (["g++", "--version"], ["gcc", "--version"], ["dpkg-query", "-W"]):
        done = subprocess.run(command, capture_output=True, timeout=60)
        digest.update(done.stdout + b"\0")
    digest.update(repr((sysconfig.get_platform(), sys.implementation.cache_tag, sysconfig.get_config_var("LIBDIR"),
                        sysconfig.get_config_var("INSTSONAME"))).encode())
    return digest.hexdigest()[:24]


def native_build_folder(source: Path) -> Path:
    """Where setup.py's build_py writes the native parts: setuptools' platform-specific build_lib."""
    build_lib = f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    return source / "build" / build_lib / "s2t" / "serve" / "native"


NATIVE_BUILDS_KEPT = 4  # the builds of the last few native sources (about 17 MB each)


# What `make native` built in this checkout, in the layout the wheel build writes.
CHECKOUT_NATIVE = ROOT / "s2t" / "serve" / "native"
NATIVE_PRODUCTS = ("libs2t_grpc_front.so", "libs2t_grpc_front_hook.so", "libs2t_http_front.so", "s2t_grpc_front",
                   f"python{sysconfig.get_config_var('VERSION')}/libtriton_s2t_inprocess.so")


def checkout_build_of(key: str) -> Path | None:
    """This checkout's own native build when it is the one setup.py would compile from the tracked files: the same
    inputs (the key: sources, build scripts, compilers, system packages, Python) and every product newer than every
    native source, the build scripts' own rule for a build that is up to date. `make integration` runs `make native`
    first, so on a fresh clone the wheel build does not compile the same sources a second time."""
    products = [CHECKOUT_NATIVE / name for name in NATIVE_PRODUCTS]
    if native_inputs_key(ROOT) != key or not all(p.is_file() for p in products):
        return None
    sources = [p for p in (ROOT / "native").rglob("*") if p.is_file() and "fuzz" not in p.relative_to(ROOT).parts]
    newest_source = max(p.stat().st_mtime for p in sources)
    return CHECKOUT_NATIVE if all(p.stat().st_mtime > newest_source for p in products) else None


def restore_native(source: Path, key: str) -> None:
    kept = NATIVE_CACHE / key
    if not kept.is_dir() and (built := checkout_build_of(key)) is not None:
        folder = native_build_folder(source)
        for name in NATIVE_PRODUCTS:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(built / name, folder / name)  # a fresh mtime: newer than every source, as a build just made
        return
    if kept.is_dir():
        try:
            # Copied with a fresh mtime: newer than every source, as a build just made them.
            shutil.copytree(kept, native_build_folder(source), copy_function=shutil.copy, dirs_exist_ok=True)
            os.utime(kept)  # the builds in use stay, the others are pruned
        except OSError:  # pruned by another run meanwhile: the build compiles them
            shutil.rmtree(native_build_folder(source), ignore_errors=True)


def keep_native(source: Path, key: str) -> None:
    built = native_build_folder(source)
    if (NATIVE_CACHE / key).is_dir() or not built.is_dir():
        return
    NATIVE_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".keeping-", dir=NATIVE_CACHE))
    try:
        shutil.copytree(built, staging / "native")
        os.rename(staging / "native", NATIVE_CACHE / key)  # whole or not at all, beside another run doing the same
    except OSError:
        if not (NATIVE_CACHE / key).is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    def used_at(build: Path) -> float:
        try:
            return build.stat().st_mtime
        except OSError:  # pruned by another run
            return 0.0
    builds = sorted((p for p in NATIVE_CACHE.iterdir() if not p.name.startswith(".")), key=used_at)
    for old in builds[:-NATIVE_BUILDS_KEPT]:
        shutil.rmtree(old, ignore_errors=True)


def install_offline(venv: Path, source: Path, dist: Path) -> subprocess.CompletedProcess:
    """What `pip install SOURCE` does (build the wheel in an isolated environment, resolve the core dependencies,
    install), with the wheelhouse as the only index; no byte-compiling of the dependencies beforehand."""
    offline = ("--no-index", "--find-links", str(WHEELHOUSE))
    shutil.rmtree(dist, ignore_errors=True)
    key = native_inputs_key(source)
    restore_native(source, key)
    built = pip(venv, "wheel", "--no-deps", "-w", str(dist), *offline, str(source))
    if built.returncode != 0:
        return built
    keep_native(source, key)
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
