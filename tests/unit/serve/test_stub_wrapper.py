"""The python backend's stub as the assembled backend directory runs it: the wheel's stub, started with the same
arguments and without the descriptors of the tritonserver it was forked from."""
import os
import socket
import subprocess

from s2t.serve.triton_server import assemble_backend_dir, server_env

# Stands in for the wheel's stub: prints its arguments, the standard descriptors it has, and the descriptor number of
# every socket it was started with.
STAND_IN = """#!/bin/bash
echo "args: $*"
for fd in 0 1 2; do if [[ -e /proc/$$/fd/$fd ]]; then echo "fd: $fd"; fi; done
for fd in /proc/$$/fd/*; do
    case "$(readlink "$fd")" in socket:*) echo "socket: ${fd##*/}";; esac
done
exit 1
"""
# A server with hundreds of connections has a socket where bash would keep its script (255, the highest it can).
HIGH_FD = 255


def start_as_triton_does(stub, args: list[str], keep: list[int]) -> subprocess.CompletedProcess:
    """`bash -c "exec STUB ARGS"` in a child that holds `keep` open, as a fork of tritonserver holds its sockets."""
    return subprocess.run(["bash", "-c", " ".join(["exec", str(stub), *args])], pass_fds=keep,
                          capture_output=True, text=True, timeout=30)


def test_the_stub_starts_with_the_servers_arguments_and_none_of_its_descriptors(tmp_path):
    python_dir = assemble_backend_dir(tmp_path / "backends") / "python"
    real = python_dir / "stub" / "triton_python_backend_stub"
    assert real.stat().st_size > 100_000, "the wheel's stub binary sits beside the wrapper"
    real.write_text(STAND_IN)
    args = ["/repo/m/1/model.py", "shm_region", "1048576", "1048576", str(os.getpid())]
    with socket.socket() as listener, socket.socket() as connection:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        connection.connect(listener.getsockname())
        os.dup2(connection.fileno(), HIGH_FD, inheritable=False)
        try:
            held = {listener.fileno(), connection.fileno(), HIGH_FD}
            unwrapped = start_as_triton_does(real, args, sorted(held))
            wrapped = start_as_triton_does(python_dir / "triton_python_backend_stub", args, sorted(held))
        finally:
            os.close(HIGH_FD)
    assert held <= listed(unwrapped, "socket"), "the premise: a child of the server holds its sockets"
    assert wrapped.stdout.splitlines()[0] == f"args: {' '.join(args)}"
    assert listed(wrapped, "socket") == set(), wrapped.stdout
    assert listed(wrapped, "fd") == {0, 1, 2}, "the log stays"
    assert wrapped.returncode == 1, "the stub's exit status passes through"


def listed(done: subprocess.CompletedProcess, kind: str) -> set[int]:
    return {int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith(f"{kind}: ")}


def test_the_wrapped_stub_without_arguments_exits_1_as_the_python_backend_checks(tmp_path):
    # The python backend runs the stub bare before each start and makes it executable when that does not give 1.
    stub = assemble_backend_dir(tmp_path / "backends") / "python" / "triton_python_backend_stub"
    done = subprocess.run([str(stub)], env=server_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done.stderr
