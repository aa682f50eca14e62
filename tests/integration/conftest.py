from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import ENSEMBLES, LLM_REPOSITORY, MODEL_REPOSITORY
from tests.integration.servers import EXPLICIT_ADMIN_KEY, serving, triton_server

HERE = Path(__file__).resolve().parent


# The modules that take longest (half a minute or more of a worker), longest first, from the level's --durations
# (its "slowest files", summed by tests/conftest.py) and single-file runs: each worker takes one file at a time in
# this order (the Makefile switches off xdist's own order, most tests first), so that no long file is left for one
# worker at the end while the other idles. The other modules follow, most tests first (those of one or two tests are
# short): a module missing here only costs time.
LONGEST_FIRST = tuple(f"{HERE}/{name}.py" for name in (
    "control/test_crash_consistency", "serve/test_lifecycle", "llm/test_llm_rollout",
    "models/test_conversion_corpus", "bench/test_bench_llm", "bench/test_bench", "serve/test_soak",
    "serve/test_grpc_front", "control/test_staged_rollout", "serve/test_http_front", "control/test_rollout",
    "bench/test_bench_cutover", "control/test_canary_analysis", "gateway/test_legacy_service",
    "gateway/test_dual_run", "pipeline/test_risk_explainer", "serve/test_clean_stop", "test_packaging",
    "llm/test_llm_abandoned", "bench/test_bench_cpu_cost",
    "models/test_example_signature", "control/test_cli_gates", "gateway/test_gateway_admission", "pipeline/test_drift",
    "edge/test_fuzz_native",
    "serve/test_http_front_relay", "serve/test_caller_errors_heal_nothing", "bench/test_bench_crossover",
    "edge/test_fuzz_grpc", "edge/test_fuzz_http", "llm/test_llm_admission", "gateway/test_legacy_and_convert"))


def pytest_collection_modifyitems(items):
    """Every test here runs the real tritonserver (or another real service): `-m "not integration"` skips them.
    The longest modules go first (LONGEST_FIRST), then the others by their number of tests, most first."""
    for item in items:
        if Path(item.path).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    tests_in = Counter(str(Path(item.path).resolve()) for item in items)
    # sort() is stable: a module's tests keep their order, and so do modules of equal rank and count.
    items.sort(key=lambda item: (rank.get(path := str(Path(item.path).resolve()), len(rank)), -tests_in[path]))


@pytest.fixture(scope="session", autouse=True)
def built_parity_references(shared_parity_reference):
    """The session's parity-reference cache seeded with the references `make models` computed when it published into
    model_repository: the same SavedModel and data have the same key, so a worker's first publish of the built
    models starts no TensorFlow either."""
    import os
    import shutil

    from s2t.control.version_store import VersionStore
    built = VersionStore(MODEL_REPOSITORY).control / "reference"
    for reference in built.glob("*.npy") if built.is_dir() else ():
        if not (shared_parity_reference / reference.name).exists():
            # Copied under another name, then renamed: the other worker never reads half a file.
            part = shared_parity_reference / f".{reference.name}.{os.getpid()}"
            shutil.copyfile(reference, part)
            part.replace(shared_parity_reference / reference.name)


@pytest.fixture(scope="session")
def triton(built_artifacts, tmp_path_factory):
    """The real embedded tritonserver on the repository as `make` built it, on free ports."""
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], log_path=log, exit_timeout_seconds=10)
    with serving(server):
        yield server


@pytest.fixture(scope="session")
def triton_explicit(built_artifacts, tmp_path_factory):
    """Explicit model-control mode with the admin key `EXPLICIT_ADMIN_KEY`, as `S2T_ADMIN_KEY=... s2t serve
    --model-control-mode explicit` runs it, on the repository as `make` built it. Started once for every file that
    checks that mode without changing the repository; a test that unloads a model loads it again."""
    log = tmp_path_factory.mktemp("triton_explicit") / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES], model_control_mode="explicit",
                           admin_key=EXPLICIT_ADMIN_KEY, log_path=log, exit_timeout_seconds=10)
    with serving(server):
        yield server


def _llm_repository_for_tests(dest: Path) -> Path:
    """A copy of model_repository_llm: risk_explainer patient enough to always reach the language model on a busy
    machine, and risk_explainer_light, whose threshold near zero forces the light path."""
    import re
    import shutil
    shutil.copytree(LLM_REPOSITORY, dest, ignore=shutil.ignore_patterns("__pycache__"))

    def explainer(name: str, threshold_s: str) -> None:
        config = dest / name / "config.pbtxt"
        if name != "risk_explainer":
            shutil.copytree(dest / "risk_explainer", dest / name)
        text = config.read_text().replace('name: "risk_explainer"', f'name: "{name}"')
        text = re.sub(r'(key: "degrade_ttft_s"\s*value: \{ string_value: )"[^"]*"', rf'\1"{threshold_s}"', text)
        config.write_text(text)
    explainer("risk_explainer", "60")
    explainer("risk_explainer_light", "0.000001")
    return dest


@pytest.fixture(scope="session")
def triton_llm(built_artifacts, tmp_path_factory):
    """The server as `s2t serve --llm` runs it: the risk repositories plus (a copy of) model_repository_llm."""
    tmp = tmp_path_factory.mktemp("triton_llm")
    log = tmp / "tritonserver.log"
    server = triton_server([MODEL_REPOSITORY, ENSEMBLES, _llm_repository_for_tests(tmp / "model_repository_llm")],
                           log_path=log, exit_timeout_seconds=10)
    with serving(server):
        yield server


@pytest.fixture
def http_client(triton):
    import tritonclient.http as http
    client = http.InferenceServerClient(triton.http_url, concurrency=8, network_timeout=60)
    yield client
    client.close()


@pytest.fixture
def grpc_client(triton):
    import tritonclient.grpc as grpc
    client = grpc.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()
