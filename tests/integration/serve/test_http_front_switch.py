"""`s2t serve --no-http-front` (or S2T_NO_HTTP_FRONT) serves the HTTP port with Triton's own HTTP front end, for
comparison; by default the HTTP front inside tritonserver answers it. No server is started here."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from s2t.cli.serve import serve
from s2t.serve import foreground
from s2t.serve.serve_options import ServeOptions


@pytest.mark.parametrize(("arguments", "environment", "front"), [
    ([], {}, True), (["--no-http-front"], {}, False), ([], {"S2T_NO_HTTP_FRONT": "1"}, False)])
def test_the_switch_reaches_the_server_s2t_serve_starts(monkeypatch, arguments, environment, front):
    seen = []
    monkeypatch.setattr(foreground, "serve", lambda options, *_: seen.append(options) or 0)
    result = CliRunner().invoke(serve, arguments, env=environment)
    assert result.exit_code == 0, result.output
    assert seen[0].http_front is front
    assert foreground.triton_server(seen[0]).http_front is front


def test_the_front_is_on_by_default():
    assert ServeOptions(repositories=()).http_front is True
