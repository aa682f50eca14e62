"""Reliability on the real server: a killed stub comes back, a full disk never half-publishes, fuzzed records
are each answered with their own error."""
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from tests.conftest import ENSEMBLES, MODEL_REPOSITORY
from s2t.control.publish import PublishError, publish
from s2t.serve.supervisor import RELOAD_GRACE_SECONDS, stubs_of
from s2t.control.version_store import VersionStore
from tests.integration.servers import triton_server
from tests.integration.traffic import PACE_S

KEY = "reliability-key"


def payload_input(records):
    array = np.array(records, dtype=object).reshape(-1, 1)
    tensor = http.InferInput("payload", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


@pytest.fixture(scope="module", params=["poll", "explicit"])
def supervised(request, built_artifacts, tmp_path_factory):
    """One supervised server per control mode for the killed-stub tests: each test kills another model's stub and
    counts only the heals after its own start, and a server stops slowly once a stub was reloaded (6 s here)."""
    root = tmp_path_factory.mktemp(f"supervised-{request.param}")
    repo = root / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    server = triton_server([repo, ENSEMBLES], model_control_mode=request.param,
                           admin_key=KEY if request.param == "explicit" else None, supervise=True,
                           log_path=root / "triton.log")
    with server:
        yield server


# (risk_pipeline has no stub: it runs inside the server process.)
@pytest.mark.parametrize("model, caller", [("skill_adapter", "risk_pipeline_ensemble"),
                                           ("risk_scorer", "risk_pipeline_ensemble")])
def test_a_killed_stub_is_loaded_again_and_serves_within_the_reload_grace(supervised, german_credit_data, model,
                                                                           caller):
    records = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:20]]
    outcomes, stop = [], threading.Event()
    heals_before = len(supervised.supervisor.heals)

    def load():
        client = http.InferenceServerClient(supervised.http_url)
        while not stop.wait(PACE_S):
            sent = time.monotonic()
            try:
                client.infer(caller, [payload_input(records[:1])])
                outcomes.append((sent, None))
            except InferenceServerException as err:
                outcomes.append((sent, err.message()))
        client.close()

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(1)
    victim = max((s for s in stubs_of(supervised.process.pid).values() if s.model == model),
                 key=lambda s: int(s.version))
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    # How soon the stub is back is the machine's speed (1.6-3 s idle, 4.8 s at load average 10 here): wait long enough
    # for any machine, and hold the supervisor to its own bound below.
    deadline = killed_at + 60
    while not any(sent > killed_at and error is None for sent, error in outcomes) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1)
    stop.set()
    thread.join(30)

    recovered = min((sent for sent, error in outcomes if sent > killed_at and error is None), default=None)
    assert recovered is not None, "the model did not serve again"
    failed = [(sent, error) for sent, error in outcomes if error is not None]
    assert failed, "killing a stub under load fails at least the requests in flight on it"
    assert all(killed_at - 0.5 <= sent <= recovered for sent, _ in failed), "failures only around the death"
    assert all("not healthy" in e or "Stub process" in e or "Failed to" in e for _, e in failed), {e for _, e in failed}
    assert not [e for sent, e in outcomes if sent > recovered and e is not None]
    heals = supervised.supervisor.heals[heals_before:]
    assert [(h.stub.pid, h.reason) for h in heals] == [(victim.pid, "stub_died")], heals
    assert recovered - heals[0].reloaded_at <= RELOAD_GRACE_SECONDS, "served again only after the reload's grace"
    print(f"\n{supervised.model_control_mode}: {model} stub killed; serving again after "
          f"{(recovered - killed_at) * 1000:.0f} ms; {len(failed)} of {len(outcomes)} requests failed")


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem with a few kilobytes free: the repository fits, a new version does not."""
    mount = tmp_path / "disk"
    mount.mkdir()
    files = [f for f in MODEL_REPOSITORY.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    # tmpfs counts whole 4 KiB pages per file; 128 KiB on top holds folders and the control area.
    size_kb = sum(4 * -(-f.stat().st_size // 4096) for f in files) + 128
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"mounting a small tmpfs needs root: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_publish_on_a_full_disk_is_refused_and_the_served_version_keeps_serving(small_disk, built_artifacts,
                                                                                  german_credit_data, tmp_path):
    repo = small_disk / "model_repository"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    before = VersionStore(repo).served("risk_scorer")
    server = triton_server([repo, ENSEMBLES], log_path=tmp_path / "triton.log")
    with server:
        filler = small_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # full; now leave less room than one version needs
            pass
        finally:
            os.close(fd)
        os.truncate(filler, max(0, filler.stat().st_size - 16 * 1024))
        with pytest.raises(PublishError, match="No space left on device"):
            publish("risk_scorer", built_artifacts["onnx"], repo, None)
        assert VersionStore(repo).served("risk_scorer") == before
        assert not list(VersionStore(repo).staging.glob("*")), "no partial version is left behind"
        time.sleep(1.5)  # a poll cycle: nothing new may be loaded
        client = http.InferenceServerClient(server.http_url)
        try:
            answer = client.infer("risk_pipeline", [payload_input(
                [json.dumps({"features": german_credit_data.records()[0]}).encode()])])
            assert answer.as_numpy("probability").shape == (1, 1)
            assert max(int(v) for v in client.get_model_metadata("risk_scorer")["versions"]) == before[-1]
        finally:
            client.close()


def mutate(record: bytes, rng: random.Random) -> bytes:
    data = bytearray(record)
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(data[: rng.randrange(len(data))])
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    parsed = json.loads(record)
    name = rng.choice(sorted(parsed["features"]))
    if kind == 3:
        del parsed["features"][name]
    elif kind == 4:
        parsed["features"][name] = rng.choice([None, True, [], {}, "x" * rng.randint(0, 40), 1e309, -0.0, 2 ** 70])
    else:
        parsed = rng.choice([[], "record", 3, {"features": None}, {"feature": parsed["features"]}])
    return json.dumps(parsed).encode()


def test_thousands_of_fuzzed_records_each_get_an_answer_or_their_own_error(triton, german_credit_data):
    rng = random.Random(20261129)
    valid = [json.dumps({"features": r}).encode() for r in german_credit_data.records()[:50]]
    fuzzed = [mutate(rng.choice(valid), rng) for _ in range(2000)]
    errors, answers, lock = [], [0], threading.Lock()

    def caller(share: list[bytes]) -> None:
        # Eight callers, each with its own connection, keep eight requests in flight. With tritonclient's async HTTP
        # calls the client's own waits, not the server, took most of the test's time.
        client = http.InferenceServerClient(triton.http_url, network_timeout=60)
        try:
            for payload in share:
                try:
                    result = client.infer("risk_pipeline", [payload_input([payload])])
                    assert 0 <= result.as_numpy("probability")[0, 0] <= 1
                    with lock:
                        answers[0] += 1
                except InferenceServerException as err:
                    with lock:
                        errors.append((err.status(), err.message()))
        finally:
            client.close()

    callers = [threading.Thread(target=caller, args=(fuzzed[k::8],)) for k in range(8)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(120)
    answers = answers[0]
    client = http.InferenceServerClient(triton.http_url)
    assert client.is_server_ready() and client.is_model_ready("risk_pipeline")
    client.close()
    assert answers + len(errors) == 2000 and len(errors) > 1000
    assert {status for status, _ in errors} == {"400"}, {s for s, _ in errors}
    assert all(m.split("', ", 1)[-1].split(":")[0] in {"payload", "features"} or
               m.split("', ", 1)[-1].startswith("features.") for _, m in errors), errors[:5]
