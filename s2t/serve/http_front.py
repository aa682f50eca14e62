"""The HTTP front of the embedded tritonserver: the public HTTP port, in front of Triton's own HTTP endpoint on a
loopback port (native/http_front.cc, built by `make native` into s2t/serve/native/). It runs inside tritonserver's
own process: the preloaded hook (s2t/serve/server_hook.py) opens it once Triton's server exists and stops it around
Triton's own stop.

Triton 2.51's HTTP front end can be killed by one request (the classification of a BYTES output: SIGFPE). The front
answers inference (POST /v2/models/NAME[/versions/V]/infer, JSON and the binary-data extension) through Triton's C
API after checking the request against the model's configuration, refusing with 400 and the field's name what would
harm the server or cannot be valid; it relays everything else unchanged to Triton's own endpoint. Where Triton's HTTP
inference answers only callers with a key (`--http-restricted-api` listing `inference`), inference is relayed too, so
that Triton checks the key.
"""
from __future__ import annotations

from pathlib import Path

from s2t.errors import S2TError
from s2t.serve import restricted_apis
from s2t.serve.request_limits import http_max_input_bytes

LIBRARY = Path(__file__).resolve().parent / "native" / "libs2t_http_front.so"
BUILD_HINT = "`make native` builds it (native/build_http_front.sh alone)"
HTTP_RESTRICTED = "--http-restricted-api"
# The most a byte of a tensor can take in a JSON body (a control character written as \u00XX), and what a request
# holds besides its tensors (model name, tensor names, shapes, parameters).
JSON_BYTES_PER_BYTE = 6
JSON_ENVELOPE_BYTES = 64 * 1024
# Requests to Triton in flight through the front at most, and open connections at most, overall and per peer. When
# every connection is taken, a new peer's takes the place of the oldest idle one (else one whose request is still
# arriving) of the peer holding most: a few addresses cannot keep the others out.
DEFAULT_MAX_CALLS = 1024
# Request bodies held in memory at once by the front, raw and inflated, all requests together: past it a request is
# answered 503 at once. Without it the bound would be --max-calls bodies of up to twice the body limit each (raw, and
# inflated to the limit), about 200 GB. A gigabyte holds five of the largest valid bodies inflated beside their
# compressed form, and hundreds of thousands of ordinary ones.
DEFAULT_MAX_BODY_MEMORY_BYTES = 1 << 30
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_MAX_CONNECTIONS_PER_PEER = 512
# Event loops sharing the public port: as many as Triton's own HTTP front end runs by default (--http-thread-count 8).
# Measured with wrk at 16 connections, risk_pipeline JSON, taking turns with Triton's own endpoint of the same server
# on a 2-core machine loaded by other work (load average 14-25, 2026-12-06): one loop 2,200-2,800 req/s, two
# 2,700-5,100, eight 2,300-7,100 against Triton's 5,000-8,800 in the same runs, mostly at less CPU per request than
# Triton's (130-165 against 158-185 us for the whole server) and a lower p99. Figures that noisy decide nothing:
# re-measure on a quiet machine before changing it.
DEFAULT_THREADS = 8
# Custom request parameters passed on to the models (the protocol's own are always taken): the ones a served model
# reads. risk_router reads `route` (a caller's choice of scorer, which it checks). Any other is refused 400 by name: no
# model would read it, and its sender expects it to do something.
CUSTOM_REQUEST_PARAMETERS = ("route",)
# A connection that sends nothing for this long is closed: an idle keep-alive connection, or a request's head or body
# that stopped arriving.
DEFAULT_IDLE_SECONDS = 60
# A request's head and body must have arrived this long after their first byte: a trickle of bytes, each within the
# idle time, is cut here.
DEFAULT_REQUEST_SECONDS = 60
# A request's head (under 16 KiB) must have arrived this long after its first byte: a connection whose head trickles in
# holds a connection without asking anything.
DEFAULT_HEAD_SECONDS = 10


class HttpFrontError(S2TError, RuntimeError):
    pass


def max_body_bytes(repositories: list[Path]) -> int:
    """The largest valid request body: the largest batch of the largest records, written as JSON strings."""
    return http_max_input_bytes(repositories) * JSON_BYTES_PER_BYTE + JSON_ENVELOPE_BYTES


def front_options(public_port: int, upstream_port: int, body_bytes: int, drain_seconds: int,
                  max_calls: int = DEFAULT_MAX_CALLS, threads: int = DEFAULT_THREADS) -> list[str]:
    """The front listening on every address (as Triton's own HTTP endpoint does by default), Triton on loopback."""
    return ["--listen", f"0.0.0.0:{public_port}", "--upstream", f"127.0.0.1:{upstream_port}",
            "--max-body-bytes", str(body_bytes), "--max-calls", str(max_calls),
            "--max-body-memory-bytes", str(DEFAULT_MAX_BODY_MEMORY_BYTES),
            "--max-connections", str(DEFAULT_MAX_CONNECTIONS),
            "--max-connections-per-peer", str(DEFAULT_MAX_CONNECTIONS_PER_PEER),
            "--idle-seconds", str(DEFAULT_IDLE_SECONDS), "--head-seconds", str(DEFAULT_HEAD_SECONDS),
            "--request-seconds", str(DEFAULT_REQUEST_SECONDS),
            "--drain-seconds", str(drain_seconds),
            "--threads", str(threads), "--request-parameters", ",".join(CUSTOM_REQUEST_PARAMETERS) or "-"]


def in_process_env(env: dict[str, str], options: list[str], triton_command: list[str],
                   library: Path | None = None) -> dict[str, str]:
    """`env` (whose LD_PRELOAD already names the hook) for a tritonserver started with `triton_command` that runs the
    front inside its process with `options` (front_options)."""
    library = library or LIBRARY
    if not library.is_file():
        raise HttpFrontError(f"the HTTP front {library} is not built: {BUILD_HINT}")
    relay_only = restricted_apis.restricts_inference(triton_command, HTTP_RESTRICTED)
    env = dict(env)
    env["S2T_HTTP_FRONT_LIBRARY"] = str(library)
    env["S2T_HTTP_FRONT_ARGS"] = " ".join([*options, "--relay-only", "1" if relay_only else "0"])
    return env

