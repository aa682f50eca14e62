"""`llm` versions through the control plane on a live server (explicit mode with the admin key, and poll mode)
under a constant load of 4 token streams: a file that cannot load is refused, publish --stage, promote and
rollback cut no stream and fail no request, every stream ends on the version it started on, and each step is in
force within a bound measured by this test's own clock."""
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from s2t.backends.llm.engine import packaged_model_path
from s2t.clients.llm_client import generate_stream
from s2t.control.live_control import ADMIN_KEY_ENV
from s2t.control.version_store import VersionStore
from tests.conftest import LLM_REPOSITORY, S2T
from tests.integration.servers import serving, triton_server

KEY = "llm-rollout-key"
CLIENTS = 4
# Version 2 is the same weights with another default answer length: which version answered shows in every
# stream's length as well as in its model_version.
V1_TOKENS, V2_TOKENS = 64, 24
# Generous for a 2-core machine shared with other test runs: the command's own start, the new version's stub and
# model load, and the old version's streams finishing are all inside it.
IN_FORCE_BOUND_S = 60.0
# How long the load runs at most (each phase waits for streams of its own, bounded by this too).
PHASE_TIMEOUT_S = 120.0


@pytest.fixture(params=["explicit", "poll"])
def live_llm(request, tmp_path):
    """A server of its own on a writable copy of `llm` and `llm_router`: the steps rewrite their configs and llm's
    version folders."""
    repo = tmp_path / "model_repository_llm"
    for name in ("llm", "llm_router"):
        shutil.copytree(LLM_REPOSITORY / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    explicit = request.param == "explicit"
    server = triton_server([repo], model_control_mode=request.param, admin_key=KEY if explicit else None,
                           log_path=tmp_path / "triton.log", exit_timeout_seconds=10)
    with serving(server):
        yield server, repo


def run_s2t(server, repo, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(S2T), *args, "--repository", str(repo), "--http-url", server.http_url, "--json"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, ADMIN_KEY_ENV: KEY})


def s2t(server, repo, *args) -> tuple[dict, float]:
    """The command's --json document and its duration on this test's clock."""
    started = time.monotonic()
    done = run_s2t(server, repo, *args)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), took


class Streams:
    """CLIENTS generate_stream clients, each starting its next stream as soon as the last one ends."""

    def __init__(self, url, model="llm", max_tokens=None):
        self.url, self.model = url, model
        self.limits = {} if max_tokens is None else {"max_tokens": max_tokens}
        self.stop = threading.Event()
        self.results = []  # (started, ended, StreamResult)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(n,)) for n in range(CLIENTS)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(PHASE_TIMEOUT_S)

    def _loop(self, n):
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            result = generate_stream(self.url, {"text_input": f"Name {i % 5 + 2} colours, client {n}.", **self.limits},
                                     model=self.model, timeout=PHASE_TIMEOUT_S)
            with self.lock:
                self.results.append((started, time.monotonic(), result))
            i += 1

    def wait_started_after(self, moment, count):
        """Until `count` streams that started after `moment` have ended (bounded); those streams."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while time.monotonic() < deadline:
            with self.lock:
                after = [r for r in self.results if r[0] > moment]
            if len(after) >= count:
                return after
            time.sleep(0.1)
        raise AssertionError(f"fewer than {count} streams ended within {PHASE_TIMEOUT_S:.0f} s")


class ServedVersion:
    """Polls which version a request without one gets, every 50 ms, keeping each change and when it was seen."""

    def __init__(self, url):
        import tritonclient.http as http
        self.client = http.InferenceServerClient(url, network_timeout=30)
        self.changes = []  # (seen at, version)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        self.client.close()

    def _loop(self):
        from s2t.control.live_control import served_version
        while not self.stop.wait(0.05):
            version = served_version(self.client, "llm")
            if not self.changes or self.changes[-1][1] != version:
                self.changes.append((time.monotonic(), version))

    def first(self, version, since) -> float:
        """Seconds from `since` until `version` was first seen serving after it."""
        seen = [at for at, v in self.changes if v == version and at > since]
        assert seen, f"version {version} never served after the step (changes: {self.changes})"
        return seen[0] - since


def ready(url, version) -> bool:
    import tritonclient.http as http
    client = http.InferenceServerClient(url, network_timeout=30)
    try:
        return client.is_model_ready("llm", version)
    finally:
        client.close()


def version_of(result) -> str:
    versions = {event.get("model_version") for _, event in result.events}
    assert len(versions) == 1, f"a stream answered by several versions: {versions}"
    return versions.pop()


def test_publish_promote_rollback_of_llm_under_four_streams_cut_no_stream_and_fail_no_request(live_llm, tmp_path):
    server, repo = live_llm
    settings = tmp_path / "v2-settings.json"
    settings.write_text(json.dumps({"default_max_tokens": V2_TOKENS}))
    with Streams(server.http_url) as load, ServedVersion(server.http_url) as watch:
        load.wait_started_after(0.0, 1)
        # A file llama.cpp cannot load (the real one cut short) is refused while the streams go on.
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(packaged_model_path().read_bytes()[:100_000])
        refused = run_s2t(server, repo, "publish", "llm", str(cut))
        assert refused.returncode != 0 and "llama.cpp cannot load it" in refused.stderr
        assert VersionStore(repo).served("llm") == [1] and VersionStore(repo).history("llm") == []
        staged, _ = s2t(server, repo, "publish", "llm", str(packaged_model_path()), "--stage",
                        "--settings", str(settings))
        assert staged["version"] == 2
        assert (repo / "llm" / "2" / "model.gguf").is_file() and (repo / "llm" / "2" / "model.py").is_file()
        status, _ = s2t(server, repo, "status", "--history", "0")
        roles = {v["version"]: (v["role"], v["state"]) for v in status["models"]["llm"]["versions"]}
        assert roles == {1: ("primary", "READY"), 2: ("candidate", "not loaded")}
        staged_at = time.monotonic()
        assert {version_of(r) for _, _, r in load.wait_started_after(staged_at, 2)} == {"1"}

        promoted_from = time.monotonic()
        promoted, promote_s = s2t(server, repo, "promote", "llm", "2")
        promoted_at = time.monotonic()
        # The previous primary stays loaded beside the new one: the rollback below only unloads.
        assert ready(server.http_url, "1") and ready(server.http_url, "2")
        after_promote = load.wait_started_after(promoted_at, 2)
        rolled_from = time.monotonic()
        rolled, rollback_s = s2t(server, repo, "rollback", "llm", "--yes")
        rolled_at = time.monotonic()
        after_rollback = load.wait_started_after(rolled_at, 2)
    results = load.results
    print(f"llm in force: promote {promote_s:.2f} s (server side {promoted['timings_ms']}), rollback "
          f"{rollback_s:.2f} s (server side {rolled['timings_ms']}), {len(results)} streams")

    failed = [r.error or f"HTTP {r.status}" for _, _, r in results if r.error or r.status != 200]
    assert failed == []
    for _, _, result in results:
        expected = V1_TOKENS if version_of(result) == "1" else V2_TOKENS
        assert result.final.get("finish_reason") in ("length", "stop"), result.final
        assert result.final["output_tokens"] <= expected
        assert result.final["finish_reason"] == "stop" or result.final["output_tokens"] == expected
    assert promoted["primary"] == 2 and rolled["serving"] == 1 and rolled["previous"] == 2
    assert {version_of(r) for _, _, r in after_promote} == {"2"}
    assert {version_of(r) for _, _, r in after_rollback} == {"1"}
    # The streams in flight when a step began finished, complete, on the version they started on.
    for began, old in ((promoted_from, "1"), (rolled_from, "2")):
        in_flight = [r for s, e, r in results if s < began < e]
        assert in_flight and {version_of(r) for r in in_flight} == {old}
    promote_in_force, rollback_in_force = watch.first(2, promoted_from), watch.first(1, rolled_from)
    print(f"llm: in force after promote {promote_in_force:.2f} s, after rollback {rollback_in_force:.2f} s "
          f"(from the command's start, this test's clock)")
    assert promote_in_force < IN_FORCE_BOUND_S and rollback_in_force < IN_FORCE_BOUND_S


# Through llm_router: short answers keep the phases short; which version answered is in every event's served_by.
ROUTED_TOKENS = 16
# Streams that must end after the canary is in force; at 50% all of one version has a chance of 2 ** -15.
CANARY_STREAMS = 16


# OpenAI completions sent during the canary (4 tokens each): the share's keys are the API's own request count.
OPENAI_CALLS = 8


def openai_versions(triton_url, calls) -> list[str]:
    """The version (system_fingerprint) that answered each of `calls` completions through the OpenAI API."""
    import openai

    from s2t.serve.openai_server import OpenAIFrontend
    from tests.integration.servers import free_port

    port = free_port()
    frontend = OpenAIFrontend(triton_url, port).start()
    sdk = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", timeout=120, max_retries=0)
    try:
        return [sdk.completions.create(model="llm", prompt="Say hi.", max_tokens=4).system_fingerprint
                for _ in range(calls)]
    finally:
        sdk.close()
        frontend.stop()


def served_by(result) -> str:
    tags = {event.get("served_by") for _, event in result.events}
    assert len(tags) == 1, f"a stream answered by several versions: {tags}"
    return tags.pop()


@pytest.mark.parametrize("live_llm", ["poll"], indirect=True)
def test_canary_of_llm_splits_generations_and_promote_and_rollback_after_it_cut_no_stream(live_llm, tmp_path):
    server, repo = live_llm
    with Streams(server.http_url, model="llm_router", max_tokens=ROUTED_TOKENS) as load:
        load.wait_started_after(0.0, 1)
        staged, _ = s2t(server, repo, "publish", "llm", str(packaged_model_path()), "--stage")
        assert staged["version"] == 2
        canary_from = time.monotonic()
        split, _ = s2t(server, repo, "canary", "llm", "2", "--percent", "50")
        canary_at = time.monotonic()
        assert split["split"] == "50% llm:1, 50% llm:2"
        status, _ = s2t(server, repo, "status", "--history", "0")
        assert status["models"]["llm_router"]["split"] == "50% llm:1, 50% llm:2"
        assert {v["version"]: v["state"] for v in status["models"]["llm"]["versions"]} == {1: "READY", 2: "READY"}
        # A bad request through the router is refused alone, naming the field, while the streams go on.
        bad = generate_stream(server.http_url, {"text_input": "Hi.", "max_tokens": 100_000}, model="llm_router")
        assert bad.status == 400 and "max_tokens" in (bad.error or "")
        openai_answers = openai_versions(server.http_url, OPENAI_CALLS)
        during_canary = load.wait_started_after(canary_at, CANARY_STREAMS)
        promoted_from = time.monotonic()
        s2t(server, repo, "promote", "llm", "2")
        promoted_at = time.monotonic()
        after_promote = load.wait_started_after(promoted_at, 2)
        rolled_from = time.monotonic()
        rolled, _ = s2t(server, repo, "rollback", "llm", "--yes")
        rolled_at = time.monotonic()
        after_rollback = load.wait_started_after(rolled_at, 2)
    results = load.results
    print(f"llm canary: {len(results)} streams through llm_router, {len(during_canary)} during the canary")

    failed = [r.error or f"HTTP {r.status}" for _, _, r in results if r.error or r.status != 200]
    assert failed == []
    for _, _, result in results:
        # Never cut: each stream ends with its final response, at its full length or at a stop.
        assert result.final.get("finish_reason") in ("length", "stop"), result.final
        assert result.final["finish_reason"] == "stop" or result.final["output_tokens"] == ROUTED_TOKENS
    assert {served_by(r) for _, _, r in during_canary} == {"llm:1", "llm:2"}
    # The OpenAI API follows the router's split: it names the version it calls, so its callers see the canary too.
    assert set(openai_answers) == {"llm:1", "llm:2"}
    assert {served_by(r) for _, _, r in after_promote} == {"llm:2"}
    assert rolled["serving"] == 1 and {served_by(r) for _, _, r in after_rollback} == {"llm:1"}
    # Streams in flight when the canary began were the primary's; those in flight at each later step finished.
    in_flight = [r for s, e, r in results if s < canary_from < e]
    assert in_flight and {served_by(r) for r in in_flight} == {"llm:1"}
    for began in (promoted_from, rolled_from):
        assert [r for s, e, r in results if s < began < e]
