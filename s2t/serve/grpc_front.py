"""The gRPC front of the embedded tritonserver: the public gRPC port, in front of Triton's own gRPC endpoint on a
loopback port (native/grpc_front.cc, built by `make native` into s2t/serve/native/). By default it runs inside
tritonserver's own process (`in_process_env`: a preloaded hook starts it once Triton's server exists and stops it
around Triton's own stop), where it answers ModelInfer through Triton's C API, with no second process and no second
gRPC hop; the rest it relays to Triton's own endpoint. `GrpcFront` runs it as a process of its own instead, which
relays everything and keeps the port open while a new tritonserver starts.

Every ModelInfer request and every ModelStreamInfer message is parsed by protobuf (classes made from Triton's own
grpc_service.proto) and checked before Triton sees it (native/infer_request_check.h): counts bounded before it is
parsed, parameters known and typed (of the custom ones, only those a served model reads, as the HTTP front), shapes
sane, and inside tritonserver what its model declares (outputs it has, no classification of a BYTES output, one kind
of model, decoupled or not, per stream). A request that fails is refused
INVALID_ARGUMENT naming the field; a stream whose message fails ends INVALID_ARGUMENT after the answers to the
messages before it. What is relayed is the message as protobuf read it, written again.

Triton 2.51's gRPC front end can crash the whole server (Signal 11) when a client cancels a ModelInfer in flight or
its deadline expires while Triton works on it; later releases (the NGC image the containers run) fixed it. The front
relays the other methods as raw bytes and never lets Triton see a unary call's cancellation: such a call carries no
deadline upstream and is never cancelled, and a client that goes away leaves it to finish unread. A stream is
half-closed upstream when its client half-closes and cancelled when its client cancels or goes away (safe in 2.51;
a decoupled model stops generating for it). At most `max_calls` upstream calls run at once, abandoned ones included;
past that a new call is refused UNAVAILABLE at once. A message over `max_message_bytes` is refused by the front.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from s2t.errors import S2TError
from s2t.serve import restricted_apis, server_hook
from s2t.serve.http_front import CUSTOM_REQUEST_PARAMETERS
from s2t.serve.parent_death import die_with_parent
from s2t.serve.serve_options import (GRPC_FRONT_MAX_CALLS, GRPC_FRONT_MESSAGE_SECONDS,
                                     GRPC_FRONT_STREAM_IDLE_SECONDS)

NATIVE = Path(__file__).resolve().parent / "native"
BINARY = NATIVE / "s2t_grpc_front"
LIBRARY = NATIVE / "libs2t_grpc_front.so"
HOOK = server_hook.HOOK
BUILD_HINT = "`make native` builds it (native/build_grpc_front.sh alone)"
GRPC_RESTRICTED = "--grpc-restricted-protocol"
# Calls to Triton in flight through the front at most. Each holds at most one message each way in the front.
DEFAULT_MAX_CALLS = GRPC_FRONT_MAX_CALLS
# A call whose first message has not come this long after it began is ended (a silent call holds a slot), and so is a
# stream with no message either way for this long.
DEFAULT_MESSAGE_SECONDS = GRPC_FRONT_MESSAGE_SECONDS
DEFAULT_STREAM_IDLE_SECONDS = GRPC_FRONT_STREAM_IDLE_SECONDS
# How long the front may take to listen once started (it binds in milliseconds).
READY_TIMEOUT_S = 10.0
SERVER_READY = "/inference.GRPCInferenceService/ServerReady"
# ServerReadyResponse{ready: true} as protobuf bytes (field 1, varint 1); the request is the empty message.
READY_ANSWER = b"\x08\x01"


class GrpcFrontError(S2TError, RuntimeError):
    pass


# Triton's options for TLS on its own gRPC endpoint (`--name=value`), which the front serves in its place.
TRITON_TLS_OPTIONS = ("--grpc-use-ssl=", "--grpc-use-ssl-mutual=", "--grpc-server-cert=", "--grpc-server-key=",
                      "--grpc-root-cert=")


@dataclass(frozen=True)
class Tls:
    """TLS on the front's public port: PEM files, as Triton's own --grpc-use-ssl options name them."""
    cert: str
    key: str
    # Set for mutual TLS (Triton's --grpc-use-ssl-mutual with --grpc-root-cert): clients show a certificate it signed.
    client_ca: str | None = None

    def options(self) -> list[str]:
        paths = [p for p in (self.cert, self.key, self.client_ca) if p]
        if any(c.isspace() for p in paths for c in p):
            raise GrpcFrontError(f"TLS files whose path holds a space cannot be given to the gRPC front: {paths}")
        return ["--tls-cert", self.cert, "--tls-key", self.key,
                *(["--tls-client-ca", self.client_ca] if self.client_ca else [])]


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "on", "yes")


def tls_of_triton(triton_command: list[str]) -> tuple[list[str], Tls | None]:
    """`triton_command` without its gRPC TLS options, and the TLS they asked for (None: plaintext), for the front to
    serve in front of Triton's own endpoint, which then listens on loopback in plaintext."""
    values = {}
    for arg in triton_command:
        if arg.startswith(TRITON_TLS_OPTIONS):
            name, value = arg.split("=", 1)
            values[name] = value
    rest = [arg for arg in triton_command if not arg.startswith(TRITON_TLS_OPTIONS)]
    mutual = _true(values.get("--grpc-use-ssl-mutual"))
    if not (_true(values.get("--grpc-use-ssl")) or mutual):
        return rest, None
    cert, key = values.get("--grpc-server-cert"), values.get("--grpc-server-key")
    if not cert or not key:
        raise GrpcFrontError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    root = values.get("--grpc-root-cert")
    if mutual and not root:
        raise GrpcFrontError("--grpc-use-ssl-mutual needs --grpc-root-cert (the CA that signs the clients' certificates)")
    return rest, Tls(cert, key, root if mutual else None)


def front_options(public_port: int, upstream_port: int, max_message_bytes: int, max_calls: int,
                  drain_seconds: int, message_seconds: int | None = None,
                  stream_idle_seconds: int | None = None) -> list[str]:
    """The front listening on every address (as Triton's own gRPC endpoint does by default), Triton on loopback: the
    options of the binary and of the front inside tritonserver alike. The time limits left out are the defaults."""
    return ["--listen", f"0.0.0.0:{public_port}", "--upstream", f"127.0.0.1:{upstream_port}",
            "--max-message-bytes", str(max_message_bytes), "--max-calls", str(max_calls),
            "--drain-seconds", str(drain_seconds),
            "--message-seconds", str(message_seconds or DEFAULT_MESSAGE_SECONDS),
            "--stream-idle-seconds", str(stream_idle_seconds or DEFAULT_STREAM_IDLE_SECONDS),
            "--request-parameters", ",".join(CUSTOM_REQUEST_PARAMETERS) or "-"]


def command(binary: Path, public_port: int, upstream_port: int, max_message_bytes: int, max_calls: int,
            drain_seconds: int, ready_fd: int | None = None, message_seconds: int | None = None,
            stream_idle_seconds: int | None = None) -> list[str]:
    """The front's binary with its options."""
    return [str(binary), *front_options(public_port, upstream_port, max_message_bytes, max_calls, drain_seconds,
                                        message_seconds, stream_idle_seconds),
            *(["--ready-fd", str(ready_fd)] if ready_fd is not None else [])]


def in_process_env(env: dict[str, str], public_port: int, upstream_port: int, max_message_bytes: int,
                   max_calls: int, drain_seconds: int, triton_command: list[str],
                   library: Path | None = None, hook: Path | None = None, message_seconds: int | None = None,
                   stream_idle_seconds: int | None = None, tls: Tls | None = None) -> dict[str, str]:
    """`env` for a tritonserver started with `triton_command` that runs the front inside its process (with `tls` on
    its public port). Where that command restricts gRPC inference to callers with a key, the front relays ModelInfer
    too, so that Triton checks the key."""
    library, hook = library or LIBRARY, hook or HOOK
    if not library.is_file():
        raise GrpcFrontError(f"the gRPC front {library} is not built: {BUILD_HINT}")
    try:
        env = server_hook.preloaded(env, hook)
    except server_hook.ServerHookError as err:
        raise GrpcFrontError(str(err)) from None
    relay_only = restricted_apis.restricts_inference(triton_command, GRPC_RESTRICTED)
    args = front_options(public_port, upstream_port, max_message_bytes, max_calls, drain_seconds, message_seconds,
                         stream_idle_seconds)
    env["S2T_GRPC_FRONT_LIBRARY"] = str(library)
    env["S2T_GRPC_FRONT_ARGS"] = " ".join(args + ["--relay-only", "1" if relay_only else "0",
                                                  *(tls.options() if tls else [])])
    return env


@dataclass
class GrpcFront:
    """One front process: `start()` returns once it listens; `stop()` lets its calls in flight end first."""

    public_port: int
    upstream_port: int
    max_message_bytes: int
    max_calls: int = DEFAULT_MAX_CALLS
    # After SIGTERM: how long calls in flight may take to be answered before the process ends.
    drain_seconds: int = 30
    message_seconds: int | None = None  # None: DEFAULT_MESSAGE_SECONDS
    stream_idle_seconds: int | None = None  # None: DEFAULT_STREAM_IDLE_SECONDS
    # Looked up when the front is made, not when this module is read.
    binary: Path = field(default_factory=lambda: BINARY)
    process: subprocess.Popen | None = None

    def start(self, stdout=None) -> "GrpcFront":
        """In its own process group, ending (after its drain) when the process that started it dies: call it from a
        thread that outlives the front, as keeper.spawn says."""
        if not os.access(self.binary, os.X_OK):
            raise GrpcFrontError(f"the gRPC front {self.binary} is not built: {BUILD_HINT}")
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                command(self.binary, self.public_port, self.upstream_port, self.max_message_bytes, self.max_calls,
                        self.drain_seconds, write_end, self.message_seconds, self.stream_idle_seconds),
                stdout=stdout, stderr=subprocess.STDOUT if stdout else None, pass_fds=(write_end,),
                preexec_fn=die_with_parent, start_new_session=True)
            os.close(write_end)
            write_end = -1
            said = _read_line(read_end, READY_TIMEOUT_S)
        finally:
            os.close(read_end)
            if write_end >= 0:
                os.close(write_end)
        if said != b"ready\n":
            code = self.stop(timeout=5)
            raise GrpcFrontError(f"the gRPC front did not start on port {self.public_port} (exit code {code}; its "
                                 f"reason is in the server's log); {BUILD_HINT} if the binary is stale")
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM (its calls in flight get `drain_seconds`), then SIGKILL past `timeout`; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.drain_seconds + 5 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _read_line(fd: int, timeout_s: float) -> bytes:
    """What the front writes on its ready pipe: `ready` and a newline, or nothing (EOF) when it exits first."""
    deadline, said = time.monotonic() + timeout_s, b""
    while not said.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 64)
        if not chunk:
            break
        said += chunk
    return said
