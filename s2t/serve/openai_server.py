"""An OpenAI-compatible API in front of Triton's `llm`: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
streamed (server-sent events) or not. A small aiohttp server: each request becomes one generate_stream call to
Triton's HTTP endpoint (backends/llm/openai_protocol.py translates both ways). A client that disconnects cancels its
handler, which closes the call to Triton, and `llm` stops the generation (docs/llm.md).

Which version generates follows `llm_router`'s split when the server has one (docs/llm.md, Versions): the API
reads the router's config (at most once a second) and calls the version it picks by name, so a canary's share holds
here too and a client that leaves still stops its own generation; without a router it calls `llm` unversioned.

`s2t serve --llm --openai-port N` runs it in a thread of its own beside the server; `python -m
s2t.serve.openai_server --port N --http-url HOST:PORT` runs it alone.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request

import aiohttp
from aiohttp import web

from s2t.backends.llm.version_routing import Splitter
from s2t.backends.llm.openai_protocol import (OpenAIError, OpenAIRequest, finish_reason, parse_request, triton_error_text,
                                              upstream_error, usage)
from s2t.backends.runtime.model_parameters import read_parameters
from s2t.backends.routing.routing_policy import RoutingSettings

MODELS = ("llm",)
# The model whose split the API follows, and how long a split read from it is used before it is read again.
ROUTER_MODEL = "llm_router"
SPLIT_REFRESH_S = 1.0
log = logging.getLogger(__name__)
# Triton answers a generate_stream call at once; only a generation can take long (bounded by max_tokens).
UPSTREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
# The longest event line read from Triton (a streamed token's is tens of bytes).
MAX_EVENT_BYTES = 1 << 20
# Well inside a probe's usual timeout (Kubernetes: 1 s by default is too tight for a busy node, so the manifests
# give 5 s), so that the probe gets a 503 rather than a timeout.
READINESS_TIMEOUT = aiohttp.ClientTimeout(total=3)
# Below stop()'s default bound (10 s), so that cleanup ends before stop() gives up on it.
SHUTDOWN_TIMEOUT = 5.0


def _error(err: OpenAIError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


def _model_path(model: str, version: int | None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "")


async def _version_ready(session: aiohttp.ClientSession, triton_url: str, model: str, version: int) -> bool:
    try:
        async with session.get(f"http://{triton_url}{_model_path(model, version)}/ready",
                               timeout=READINESS_TIMEOUT) as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


async def _events(session: aiohttp.ClientSession, triton_url: str, request: OpenAIRequest,
                  version: int | None = None):
    """`llm`'s events (of `version`; None: the newest loaded): each token's text, then the final one (counts,
    finish reason); OpenAIError when refused. A version the split named that is no longer loaded (unloaded since
    the split was read) gives way to the newest loaded one."""
    gone = False
    async with session.post(f"http://{triton_url}{_model_path(request.model, version)}/generate_stream",
                            json=request.triton_body()) as response:
        if response.status != 200:
            # A refusal comes as one JSON body ({"error": ...}), not as events: its text is the caller's answer.
            text = triton_error_text(response.status, await response.read())
            if version is None or await _version_ready(session, triton_url, request.model, version):
                raise upstream_error(response.status, text)
            gone = True
        else:
            # Each network read split into its lines at once: one wait per read rather than one per line (an event
            # is its data line and a blank one), on the path of every token.
            rest = b""
            async for data in response.content.iter_any():
                lines = (rest + data).split(b"\n")
                rest = lines.pop()
                if len(rest) > MAX_EVENT_BYTES:
                    raise OpenAIError(502, f"the model server sent an event over {MAX_EVENT_BYTES} bytes",
                                      kind="server_error")
                for line in lines:
                    if line.startswith(b"data:"):
                        yield _event(line, response.status)
            if rest.startswith(b"data:"):
                yield _event(rest, response.status)
    if gone:
        async for event in _events(session, triton_url, request):
            yield event


def _event(line: bytes, status: int) -> dict:
    try:
        event = json.loads(line[5:])
    except ValueError:
        raise OpenAIError(502, "the model server sent a malformed event", kind="server_error") from None
    if "error" in event:
        raise upstream_error(status, str(event["error"]))
    return event


def _fingerprint(event: dict) -> dict:
    """OpenAI's `system_fingerprint` (the configuration that answered): the model version, `llm:2`."""
    if "model_name" in event and "model_version" in event:
        return {"system_fingerprint": f"{event['model_name']}:{event['model_version']}"}
    return {}


def _upstream_failure(err: Exception) -> OpenAIError:
    """A failed call to Triton in OpenAI's error shape."""
    if isinstance(err, OpenAIError):
        return err
    if isinstance(err, asyncio.TimeoutError):
        return OpenAIError(504, "the model server did not answer in time", kind="server_error")
    return OpenAIError(503, f"the model server cannot be reached: {err}", kind="server_error")


class OpenAIFrontend:
    def __init__(self, triton_url: str, port: int, host: str = "0.0.0.0"):
        self.triton_url, self.port, self.host = triton_url, port, host
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        # llm_router's split as last read (None: no router), its request count kept across reads.
        self._split: tuple[RoutingSettings, set[int]] | None = None
        self._split_read_at = -SPLIT_REFRESH_S
        # The last read of the split (kept referenced while it runs); None before the first.
        self._split_reading: asyncio.Future | None = None
        self._splitter: Splitter | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.cleanup_ctx.append(self._session)
        return app

    async def _session(self, app):
        # One session for every request, but no idle connection kept to Triton: a stopping Triton waits for every
        # open HTTP connection to close (up to its exit timeout, then exits with an error), and idle pooled ones
        # never would. A connection per call on the same host costs nothing beside a generation.
        self.session = aiohttp.ClientSession(timeout=UPSTREAM_TIMEOUT,
                                             connector=aiohttp.TCPConnector(force_close=True))
        yield
        await self.session.close()

    async def models(self, _request: web.Request) -> web.Response:
        # Listed only while Triton is ready (with --strict-readiness: every model loaded), so that this path is the
        # deployments' readiness probe for the API and the server behind it together.
        try:
            async with self.session.get(f"http://{self.triton_url}/v2/health/ready",
                                        timeout=READINESS_TIMEOUT) as response:
                ready = response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ready = False
        if not ready:
            return _error(OpenAIError(503, "the model server is not ready", kind="server_error"))
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "skill2triton"} for name in MODELS]})

    async def _version(self, model: str) -> int | None:
        """The version of `model` that llm_router's split picks for a new generation; None without a router.
        Only the first request waits for the split to be read: later reads run beside the request that starts them
        (a round trip to Triton that would otherwise add to that request's time to first token), which uses the
        split read before, at most a read's time older than the refresh period."""
        if time.monotonic() - self._split_read_at >= SPLIT_REFRESH_S:
            self._split_read_at = time.monotonic()
            if self._split_reading is None:
                self._split = await self._read_split(model)
                self._split_reading = asyncio.get_running_loop().create_future()
                self._split_reading.set_result(None)
            elif self._split_reading.done():
                self._split_reading = asyncio.ensure_future(self._refresh_split(model))
        if self._split is None:
            return None
        routing, loaded = self._split
        if self._splitter is None:
            self._splitter = Splitter(routing)
        self._splitter.routing = routing
        return self._splitter.target(None, lambda target: target.version in loaded).version

    async def _refresh_split(self, model: str) -> None:
        self._split = await self._read_split(model)

    async def _read_split(self, model: str) -> tuple[RoutingSettings, set[int]] | None:
        """The router's live split and which of its versions are loaded; None when the server has no router."""
        try:
            async with self.session.get(f"http://{self.triton_url}/v2/models/{ROUTER_MODEL}/config",
                                        timeout=READINESS_TIMEOUT) as response:
                if response.status != 200:
                    return None
                config = await response.json()
            routing = read_parameters(RoutingSettings, config.get("parameters", {}))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        if routing.primary.model != model:
            return None
        named = {t.version for t in (routing.primary, routing.candidate) if t is not None and t.version is not None}
        return routing, {v for v in named if await _version_ready(self.session, self.triton_url, model, v)}

    async def chat_completions(self, http_request: web.Request) -> web.StreamResponse:
        return await self.complete(http_request, chat=True)

    async def completions(self, http_request: web.Request) -> web.StreamResponse:
        return await self.complete(http_request, chat=False)

    async def complete(self, http_request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            request = parse_request(await http_request.read(), chat, MODELS)
        except OpenAIError as err:
            return _error(err)
        events = _events(self.session, self.triton_url, request, await self._version(request.model))
        try:
            if request.stream:
                return await self._stream(http_request, request, events)
            pieces, final = [], {}
            async for event in events:
                if "finish_reason" in event:
                    final = event
                elif event.get("text_output"):
                    pieces.append(event["text_output"])
            return web.json_response({**request.whole("".join(pieces), finish_reason(final), usage(final)),
                                      **_fingerprint(final)})
        except (OpenAIError, aiohttp.ClientError, asyncio.TimeoutError) as err:
            return _error(_upstream_failure(err))

    async def _stream(self, http_request: web.Request, request: OpenAIRequest, events) -> web.StreamResponse:
        response = None
        try:
            async for event in events:
                if response is None:
                    # Headers go once Triton has accepted the request, so a refusal is still a plain HTTP error.
                    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
                    await response.prepare(http_request)
                if "finish_reason" in event:
                    await _send(response, {**request.chunk("", finish_reason(event)), **_fingerprint(event)})
                    if request.include_usage:
                        await _send(response, request.usage_chunk(usage(event)))
                elif event.get("text_output"):
                    await response.write(request.token_event(event["text_output"]))
        except (OpenAIError, aiohttp.ClientError, asyncio.TimeoutError) as err:
            if response is None:
                return _error(_upstream_failure(err))
            # The event stream has begun (status 200 sent): the failure can only be its last event.
            await _send(response, _upstream_failure(err).body())
        if response is None:
            return _error(OpenAIError(502, "the model server ended the stream without an answer", kind="server_error"))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def start(self, timeout: float = 30.0) -> "OpenAIFrontend":
        """Serves from a thread of its own until stop(); returns once the port has answered a request, so that
        whoever is told the API is ready (`s2t serve`'s `ready:` line) finds it answering."""
        deadline = time.monotonic() + timeout
        self._thread = threading.Thread(target=self._run, name="openai-frontend", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure is not None:
            raise RuntimeError(f"the OpenAI API could not start on port {self.port}: {self._failure}")
        try:
            self._wait_answering(deadline)
        except RuntimeError:
            self.stop()
            raise
        return self

    def _wait_answering(self, deadline: float) -> None:
        """Until /v1/models answers on the port, whatever its status (503 while Triton is not ready): a bound
        socket is not yet a served one, and the first request also sets up what every later one uses."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/v1/models"
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP_PROXY
        while True:
            try:
                with direct.open(url, timeout=max(0.1, deadline - time.monotonic())):
                    return
            except urllib.error.HTTPError:
                return
            except (OSError, http.client.HTTPException) as err:
                if time.monotonic() >= deadline or self._failure is not None:
                    raise RuntimeError(f"the OpenAI API does not answer on port {self.port}: {err}") from None
                time.sleep(0.01)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            # handler_cancellation: a client that disconnects cancels its handler, which closes the call to Triton.
            # shutdown_timeout: in-flight handlers get this long, inside stop()'s own bound, before they are cut.
            self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                         shutdown_timeout=SHUTDOWN_TIMEOUT)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.TCPSite(self._runner, self.host, self.port).start())
            self.port = self._runner.addresses[0][1]  # the port the system chose for 0
        except BaseException as err:  # noqa: BLE001 - reported by start() to its caller
            self._failure = err
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            # What stop() gave up waiting for (a cleanup, a handler) is cancelled here, briefly waited for, so that
            # no task is left on a closed loop.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.wait(pending, timeout=SHUTDOWN_TIMEOUT))
            self._loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops serving within about `timeout` seconds and never raises: the caller has its own cleanup to do."""
        if self._loop is None or self._runner is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        try:
            future.result(timeout)
        except Exception as err:  # noqa: BLE001 - a stuck or failed cleanup is logged; the loop stops regardless
            future.cancel()
            log.warning("the OpenAI API did not stop cleanly: %r", err)
        finally:
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:  # the loop has already stopped and closed
                pass
            if self._thread is not None:
                self._thread.join(timeout)


async def _send(response: web.StreamResponse, payload: dict) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--http-url", default="localhost:8000", help="Triton's HTTP endpoint, HOST:PORT")
    args = parser.parse_args()
    web.run_app(OpenAIFrontend(args.http_url, args.port).app(), port=args.port, handler_cancellation=True)


if __name__ == "__main__":
    main()
