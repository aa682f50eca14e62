"""What a rollback imports before its live switch: the modules that ask the server bring tritonclient (and numpy,
gevent, grpc with it) only when a step first asks."""
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("tritonclient", "numpy", "gevent", "grpc")


def test_the_modules_that_ask_the_server_import_no_client_library_until_they_ask():
    shown = subprocess.run(
        [sys.executable, "-c", "import sys\nimport s2t.control.live_control, s2t.control.reachability\n"
                               f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == []


def test_the_rollout_reads_configs_with_tritons_schema_alone_and_the_client_package_later_shares_it():
    """Triton's schema is the wheel's model_config_pb2, loaded without the client package it sits in (grpc, numpy);
    an import of that package afterwards finds the same module, so the schema's protobuf file is defined once."""
    shown = subprocess.run(
        [sys.executable, "-c", "import sys\nimport s2t.control.rollout\nfrom s2t import triton_config\n"
                               f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
                               "config = triton_config.load('model_repository/risk_pipeline')\n"
                               "import tritonclient.grpc\n"
                               "print(tritonclient.grpc.model_config_pb2 is triton_config.mc, config.name,\n"
                               "      type(config) is tritonclient.grpc.model_config_pb2.ModelConfig)"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["tritonclient.grpc.model_config_pb2", "True risk_pipeline True"]
