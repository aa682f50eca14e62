"""The check every command that changes what is served makes first: does anything answer HTTP at the address."""
from contextlib import contextmanager

import pytest

from tests.conftest import free_port
from tests.unit.http_stand_in import http_stand_in
from s2t.control.reachability import require_reachable
from s2t.errors import ServerUnreachable


@contextmanager
def answering(status: int):
    """An HTTP server on a free port that answers every GET with `status`."""
    with http_stand_in(lambda request: (status, b"")) as port:
        yield f"127.0.0.1:{port}"


@pytest.mark.parametrize("status", [200, 400, 503])
def test_any_http_answer_counts_as_reachable(status):
    with answering(status) as url:
        require_reachable(url)


@pytest.mark.parametrize("url", [f"localhost:{free_port()}", "no-such-host.invalid:8000", "localhost:8000/x y"],
                         ids=["nothing-listens", "unknown-host", "not-an-address"])
def test_nothing_answering_is_unreachable_and_says_where(url):
    with pytest.raises(ServerUnreachable, match="no Triton answers HTTP at"):
        require_reachable(url)


def test_a_proxy_from_the_environment_does_not_answer_for_a_server_that_is_down(monkeypatch):
    with answering(200) as proxy:
        for name in ("http_proxy", "HTTP_PROXY"):
            monkeypatch.setenv(name, f"http://{proxy}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        with pytest.raises(ServerUnreachable):
            require_reachable(f"localhost:{free_port()}")


def test_no_address_is_no_check():
    require_reachable(None)
