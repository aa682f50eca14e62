"""How the gRPC front and tritonserver are started: the front on the public gRPC port (inside tritonserver through a
preloaded hook, or as a process of its own), Triton's own gRPC endpoint on a loopback port behind it, or (only to
measure the front) Triton on the public port itself; and Triton's latency summaries, off unless asked for."""
from pathlib import Path

import pytest

from s2t.serve import grpc_front
from s2t.serve.grpc_front import GrpcFrontError, command, in_process_env
from s2t.serve.keeper import option
from s2t.serve.triton_server import TritonServer


def test_the_front_listens_on_every_address_and_forwards_to_loopback():
    assert command(Path("/b/s2t_grpc_front"), 8001, 40000, 1000, 16, 35, ready_fd=7) == [
        "/b/s2t_grpc_front", "--listen", "0.0.0.0:8001", "--upstream", "127.0.0.1:40000",
        "--max-message-bytes", "1000", "--max-calls", "16", "--drain-seconds", "35", "--message-seconds", "10",
        "--stream-idle-seconds", "60", "--request-parameters", "route", "--ready-fd", "7"]


def test_the_fronts_time_limits_are_passed_with_their_defaults_where_none_is_given(tmp_path, monkeypatch):
    given = command(Path("/b/f"), 8001, 40000, 1000, 16, 35, message_seconds=3, stream_idle_seconds=7)
    assert given[given.index("--message-seconds"):][:4] == ["--message-seconds", "3", "--stream-idle-seconds", "7"]
    monkeypatch.setattr(grpc_front, "DEFAULT_STREAM_IDLE_SECONDS", 5)
    made = in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **_built(tmp_path))
    assert "--stream-idle-seconds 5 " in made["S2T_GRPC_FRONT_ARGS"]
    made = in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **_built(tmp_path), message_seconds=4)
    assert "--message-seconds 4 " in made["S2T_GRPC_FRONT_ARGS"]


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


def _built(tmp_path) -> dict:
    library, hook = tmp_path / "libs2t_grpc_front.so", tmp_path / "libs2t_grpc_front_hook.so"
    library.write_bytes(b"")
    hook.write_bytes(b"")
    return {"library": library, "hook": hook}


@pytest.mark.parametrize("preload, rest", [(None, ""), ("/x/libjemalloc.so", "/x/libjemalloc.so")],
                         ids=["no-preload", "a-preload-kept"])
def test_inside_tritonserver_the_hook_is_preloaded_and_told_the_fronts_options(tmp_path, preload, rest):
    built = _built(tmp_path)
    env = {"PATH": "/bin"} | ({"LD_PRELOAD": preload} if preload else {})
    made = in_process_env(env, 8001, 40000, 1000, 16, 35, ["tritonserver"], **built)
    assert made["LD_PRELOAD"].split(":") == [str(built["hook"])] + ([preload] if preload else [])
    assert made["S2T_GRPC_FRONT_PRELOAD_REST"] == rest  # the hook leaves the stubs this, not itself
    assert made["S2T_GRPC_FRONT_LIBRARY"] == str(built["library"])
    assert made["S2T_GRPC_FRONT_ARGS"].split() == [
        "--listen", "0.0.0.0:8001", "--upstream", "127.0.0.1:40000", "--max-message-bytes", "1000",
        "--max-calls", "16", "--drain-seconds", "35", "--message-seconds", "10", "--stream-idle-seconds", "60",
        "--request-parameters", "route", "--relay-only", "0"]
    assert made["PATH"] == "/bin" and env.get("LD_PRELOAD") == preload  # the caller's env untouched


@pytest.mark.parametrize("option_value, relay_only", [
    ("--grpc-restricted-protocol=shared-memory,logging,trace:admin-key=k", "0"),
    ("--grpc-restricted-protocol=inference,trace:admin-key=k", "1"),
    ("--http-restricted-api=inference:admin-key=k", "0"),
    ("--grpc-restricted-protocol inference:admin-key=k", "1"),
    ("--grpc-restricted-protocol trace:admin-key=k", "0")])
def test_where_grpc_inference_needs_a_key_modelinfer_is_relayed_for_triton_to_check_it(tmp_path, option_value,
                                                                                     relay_only):
    made = in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver", *option_value.split()], **_built(tmp_path))
    assert made["S2T_GRPC_FRONT_ARGS"].split()[-2:] == ["--relay-only", relay_only]


def test_a_missing_build_is_named_with_how_to_build_it(tmp_path):
    built = _built(tmp_path)
    built["hook"].unlink()
    with pytest.raises(GrpcFrontError, match=r"libs2t_grpc_front_hook.so is not built: `make native` builds it"):
        in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **built)


def test_a_hook_path_ld_preload_cannot_name_is_refused_before_tritonserver_starts(tmp_path):
    folder = tmp_path / "a folder"
    folder.mkdir()
    built = _built(folder)
    with pytest.raises(GrpcFrontError, match=r"has a ':' or a space.*install skill2triton elsewhere"):
        in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **built)


@pytest.mark.parametrize("triton_tls, front_tls", [
    ([], None),
    (["--grpc-use-ssl=false", "--grpc-server-cert=/c", "--grpc-server-key=/k"], None),
    (["--grpc-use-ssl=true", "--grpc-server-cert=/c", "--grpc-server-key=/k"], grpc_front.Tls("/c", "/k")),
    # A root certificate without mutual TLS verifies nothing in Triton: none for the front either.
    (["--grpc-use-ssl=1", "--grpc-server-cert=/c", "--grpc-server-key=/k", "--grpc-root-cert=/ca"],
     grpc_front.Tls("/c", "/k")),
    # Mutual TLS implies TLS, as in Triton.
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=/c", "--grpc-server-key=/k", "--grpc-root-cert=/ca"],
     grpc_front.Tls("/c", "/k", "/ca")),
])
def test_tritons_grpc_tls_options_become_the_fronts_and_leave_tritons_command(triton_tls, front_tls):
    rest, tls = grpc_front.tls_of_triton(["tritonserver", "--grpc-port=9", *triton_tls, "--log-verbose=0"])
    assert (rest, tls) == (["tritonserver", "--grpc-port=9", "--log-verbose=0"], front_tls)


@pytest.mark.parametrize("triton_tls, named", [
    (["--grpc-use-ssl=true", "--grpc-server-key=/k"], "--grpc-server-cert"),
    (["--grpc-use-ssl-mutual=true", "--grpc-server-cert=/c", "--grpc-server-key=/k"], "--grpc-root-cert"),
])
def test_tls_asked_without_its_files_is_refused_naming_the_missing_option(triton_tls, named):
    with pytest.raises(GrpcFrontError, match=named):
        grpc_front.tls_of_triton(["tritonserver", *triton_tls])


def test_the_fronts_tls_files_are_passed_to_it_and_a_path_with_a_space_is_refused(tmp_path):
    made = in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **_built(tmp_path),
                          tls=grpc_front.Tls("/c.pem", "/k.pem", "/ca.pem"))
    assert made["S2T_GRPC_FRONT_ARGS"].endswith("--tls-cert /c.pem --tls-key /k.pem --tls-client-ca /ca.pem")
    with pytest.raises(GrpcFrontError, match="space"):
        in_process_env({}, 8001, 40000, 1000, 16, 35, ["tritonserver"], **_built(tmp_path),
                       tls=grpc_front.Tls("/my certs/c.pem", "/k.pem"))
