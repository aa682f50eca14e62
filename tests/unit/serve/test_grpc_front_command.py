"""How the gRPC front and tritonserver are started: the front on the public gRPC port, Triton's own gRPC endpoint on
a loopback port behind it, or (only to measure the front) Triton on the public port itself; and Triton's latency
summaries, off unless asked for."""
from pathlib import Path

import pytest

from s2t.serve.grpc_front import command
from s2t.serve.keeper import option
from s2t.serve.triton_server import TritonServer


def test_the_front_listens_on_every_address_and_forwards_to_loopback():
    assert command(Path("/b/s2t_grpc_front"), 8001, 40000, 1000, 16, 35, ready_fd=7) == [
        "/b/s2t_grpc_front", "--listen", "0.0.0.0:8001", "--upstream", "127.0.0.1:40000",
        "--max-message-bytes", "1000", "--max-calls", "16", "--drain-seconds", "35", "--ready-fd", "7"]


@pytest.mark.parametrize("front, address, port", [(True, "127.0.0.1", "40000"), (False, None, "8001")],
                         ids=["behind-the-front", "front-off"])
def test_tritons_grpc_endpoint_is_on_loopback_behind_the_front_and_public_without_it(front, address, port, tmp_path):
    server = TritonServer([tmp_path], 8000, 8001, 8002, grpc_front=front, triton_grpc_port=40000 if front else None)
    cmd = server.command(tmp_path / "backends")
    assert option(cmd, "grpc-address") == address and option(cmd, "grpc-port") == port
    assert [arg for arg in cmd if arg.startswith("--grpc-port=")] == [f"--grpc-port={port}"]
    assert server.grpc_url == "localhost:8001" and server.triton_grpc_url == f"localhost:{port}"


def test_latency_summaries_are_off_unless_asked_for_and_then_only_the_served_quantiles(tmp_path):
    def metrics_config(server):
        return [arg for arg in server.command(tmp_path / "backends") if arg.startswith("--metrics-config=")]
    assert metrics_config(TritonServer([tmp_path])) == []
    assert metrics_config(TritonServer([tmp_path], latency_summaries=True)) == [
        "--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.01"]
