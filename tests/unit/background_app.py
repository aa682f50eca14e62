"""An aiohttp app served on a free port from a thread of its own, for unit tests that need an HTTP peer."""
from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from s2t.serve.triton_server import free_port


class BackgroundApp:
    """Subclasses add their routes in `routes(app)`; `with` starts the app and stops it."""

    def __init__(self):
        self.port = free_port()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _run(self):
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        self.routes(app)
        # A stand-in owes a handler still running at exit nothing: the test that started it is over.
        self.runner = web.AppRunner(app, shutdown_timeout=0.05)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self.loop.run_forever()
        self.loop.close()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
