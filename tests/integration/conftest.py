from pathlib import Path

import pytest

from tests.conftest import ENSEMBLES, LLM_REPOSITORY, MODEL_REPOSITORY, free_port
from tools.triton_server import TritonServer


@pytest.fixture(scope="session")
def triton(built_artifacts, tmp_path_factory):
    """The real embedded tritonserver on the repository as `make` built it, on free ports."""
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    server = TritonServer([MODEL_REPOSITORY, ENSEMBLES], free_port(), free_port(), free_port(), log_path=log,
                          exit_timeout_seconds=10)
    try:
        server.start(timeout=120)
    except Exception:
        print(Path(log).read_text()[-5000:] if Path(log).exists() else "no log")
        raise
    yield server
    server.stop()


@pytest.fixture(scope="session")
def triton_llm(built_artifacts, tmp_path_factory):
    """The server as `s2t serve --llm` runs it: the risk repositories plus model_repository_llm."""
    log = tmp_path_factory.mktemp("triton_llm") / "tritonserver.log"
    server = TritonServer([MODEL_REPOSITORY, ENSEMBLES, LLM_REPOSITORY], free_port(), free_port(), free_port(),
                          log_path=log, exit_timeout_seconds=10)
    try:
        server.start(timeout=120)
    except Exception:
        print(Path(log).read_text()[-5000:] if Path(log).exists() else "no log")
        raise
    yield server
    server.stop()


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
