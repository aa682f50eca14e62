"""A standard-library HTTP server on a free port of 127.0.0.1, in a thread of its own, for unit tests that need an
HTTP peer that answers as they say (the aiohttp one, background_app.py, for an app with routes)."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator


@contextmanager
def http_stand_in(answer: Callable[[BaseHTTPRequestHandler], tuple[int, bytes]]) -> Iterator[int]:
    """Every GET and POST answered with `answer(request)`'s status and body; yields the port."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's naming
            status, body = answer(self)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for serve_forever's next look at its flag: every 0.5 s by default.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
