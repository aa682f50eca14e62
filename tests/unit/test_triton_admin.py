"""s2t/triton_admin.py where no server answers: every call says so its own way, and waiting ends with the process.
(The calls against a live tritonserver run in tests/integration: every server fixture waits through it.)"""
import socket
import time

import pytest

from s2t.triton_admin import UNREACHABLE, TritonAdmin, wait_until_ready
from tests.unit.http_stand_in import http_stand_in


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

    def proxy(request):
        seen.append(dict(request.headers))
        return 200, b"{}"

    with http_stand_in(proxy) as port:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        assert nobody.is_ready() is False
        with pytest.raises(UNREACHABLE):
            nobody.repository_index()
        with pytest.raises(UNREACHABLE):
            nobody.check_live()
    assert seen == []
