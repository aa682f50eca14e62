"""s2t/triton_admin.py where no server answers: every call says so its own way, and waiting ends with the process.
(The calls against a live tritonserver run in tests/integration: every server fixture waits through it.)"""
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from s2t.triton_admin import UNREACHABLE, TritonAdmin, wait_until_ready


@pytest.fixture
def nobody() -> TritonAdmin:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return TritonAdmin(f"127.0.0.1:{port}", {"triton-admin-key": "k"})


def test_an_unreachable_server_is_not_ready_and_its_versions_unknown(nobody):
    assert nobody.is_ready() is False
    assert nobody.is_version_ready("risk_scorer", "1") is None


@pytest.mark.parametrize("call", [lambda a: a.model_config("risk_scorer"), lambda a: a.model_stats("risk_scorer"),
                                  lambda a: a.repository_index(), lambda a: a.load("risk_scorer", {"name": "x"}),
                                  lambda a: a.check_live()])
def test_calls_to_an_unreachable_server_raise_one_of_the_unreachable_errors(nobody, call):
    with pytest.raises(UNREACHABLE):
        call(nobody)


def test_waiting_ends_as_soon_as_the_process_is_gone(nobody):
    started = time.monotonic()
    assert wait_until_ready(nobody, running=lambda: False, timeout_s=60) is False
    assert time.monotonic() - started < 30


def test_waiting_ends_at_the_timeout_while_the_process_runs(nobody):
    polls = []
    assert wait_until_ready(nobody, running=lambda: polls.append(1) or True, timeout_s=0.2, poll_s=0.04) is False
    assert 1 <= len(polls) <= 10


def test_a_proxy_named_in_the_environment_answers_for_no_server(nobody, monkeypatch):
    """Every call goes straight to the server: a proxy would answer for one that is down and see the admin key."""
    seen = []

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        do_POST = do_GET

        def log_message(self, *args):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.server_address[1]}")
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        assert nobody.is_ready() is False
        with pytest.raises(UNREACHABLE):
            nobody.repository_index()
        with pytest.raises(UNREACHABLE):
            nobody.check_live()
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join()
    assert seen == []
