"""A rollout command killed (SIGKILL) between any two of its writes, then the next command: every consumer's
version exists and is loaded, and nothing a consumer served when the command died is retired under it.

The killed command runs in a subprocess with `S2T_FAULT_POINTS=control.<boundary>=kill`, which stops it with
SIGKILL at that boundary (backends/runtime/fault_points.py), as the OOM killer or a lost host would."""
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tritonclient.grpc as grpc

from s2t.backends.runtime.fault_points import ENVIRONMENT_VARIABLE
from s2t.control import primary
from s2t.control.live_control import ADMIN_KEY_ENV, admin_headers, live_configs
from s2t.control.publish import publish
from s2t.control.rollout import Rollout, canary, promote, rollback, rollback_plan
from s2t.control.version_store import ControlLockTimeout, VersionStore
from s2t.serve.supervisor import RELOAD_PARAMETER, Reloader
from tests.conftest import ENSEMBLES, MODEL_REPOSITORY, ROOT, S2T
from tests.integration.servers import repository_copies, triton_server
from tests.integration.control.test_staged_rollout import Load, infer, payloads

MODEL = "risk_scorer"
CONSUMERS = ("risk_pipeline", "risk_router", "risk_pipeline_ensemble")  # the order they are written in
KILLED = """
import sys
import threading
from pathlib import Path
from s2t.control.publish import publish
from s2t.control.rollout import Rollout, canary, promote, rollback, rollback_plan
repo, onnx, command, arg = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
rollout = Rollout("risk_scorer", repo)
if command == "publish":
    publish("risk_scorer", onnx, repo, None, stage=arg == "stage")
elif command == "promote":
    promote(rollout, int(arg))
elif command == "rollback":
    rollback(rollout, rollback_plan(rollout, int(arg) if arg else None))
else:
    canary(rollout, int(arg), 10.0, 0.0)
"""


def _publish(stage=False):
    return lambda repo, onnx: publish(MODEL, onnx, repo, None, stage=stage)


def _canary(version):
    return lambda repo, onnx: canary(Rollout(MODEL, repo), version, 50.0, 0.0)


def _aged(repo, onnx):
    """As if the last command ran long ago: whatever drains may go, no consumer still runs the previous."""
    rollout = Rollout(MODEL, repo)
    state = rollout.state()
    state.previous_until, state.draining = 0.0, {v: 0.0 for v in state.draining}
    rollout.save(state)


CONSUMER_POINTS = [f"consumer.{name}" for name in CONSUMERS]
# (what happened before, the command killed, its argument, the boundaries it passes)
SCENARIOS = {
    "publish": ([_publish(), _aged], "publish", "",
                ["recorded", "intent", "switched", "placed", *CONSUMER_POINTS, "retired", "saved"]),
    "stage": ([], "publish", "stage", ["recorded", "intent", "placed", "saved"]),
    "promote": ([_publish(), _publish(stage=True), _canary(3), _aged], "promote", "3",
                ["recorded", "intent", "switched", *CONSUMER_POINTS, "retired", "saved"]),
    "revert": ([_publish()], "rollback", "", ["recorded", "intent", "switched", *CONSUMER_POINTS, "saved"]),
    "revert-to-retired": ([_publish(), _aged, _publish()], "rollback", "1", ["restored", "switched", *CONSUMER_POINTS]),
    "abort": ([_publish(stage=True), _canary(2)], "rollback", "", ["intent", "switched", "consumer.risk_router", "saved"]),
    "canary": ([_publish(stage=True)], "canary", "2", ["intent", "consumer.risk_router", "saved"]),
}
CASES = [(name, point) for name, (_, _, _, points) in SCENARIOS.items() for point in points]


def named_by_consumers(repo: Path) -> set[int]:
    return Rollout(MODEL, repo).named_by_consumers()


def check_served_and_consistent(repo: Path, must_stay: set[int]) -> None:
    store, rollout = VersionStore(repo), Rollout(MODEL, repo)
    served = set(store.served(MODEL))
    consumers = {c.name: c.version for c in primary.consumers(MODEL, rollout.repositories)}
    state = rollout.state()
    assert set(consumers.values()) == {state.primary}, (consumers, state)
    assert state.pending is None
    assert rollout.named_by_consumers() <= served, "a consumer names a version whose folder is gone"
    assert must_stay <= served, f"retired while a consumer may still serve it: {must_stay - served}"
    assert {v for v in (state.previous, state.candidate) if v is not None} <= served
    assert all((store.model_dir(MODEL) / str(v) / "model.onnx").is_file() for v in served), "a partial folder"


@pytest.fixture
def repo(tmp_path, built_artifacts):
    repo, ensembles = tmp_path / "model_repository", tmp_path / "ensembles"
    shutil.copytree(MODEL_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ENSEMBLES, ensembles, ignore=shutil.ignore_patterns("__pycache__"))
    for version in VersionStore(repo).served(MODEL)[1:]:
        shutil.rmtree(repo / MODEL / str(version))
    return repo


@pytest.mark.parametrize("scenario, point", CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_a_command_killed_at_any_boundary_leaves_what_the_next_commands_serve_from(repo, built_artifacts,
                                                                                   scenario, point):
    onnx = built_artifacts["onnx"]
    before, command, arg, _ = SCENARIOS[scenario]
    for step in before:
        step(repo, onnx)
    named_before = named_by_consumers(repo)
    killed = subprocess.run([sys.executable, "-c", KILLED, str(repo), str(onnx), command, arg], cwd=ROOT,
                            env={**os.environ, ENVIRONMENT_VARIABLE: f"control.{point}=kill"},
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, f"not killed at control.{point}: {killed.stderr[-2000:]}"
    # What a live server may still run: what the consumers named before the command and where it left them.
    may_serve = named_before | named_by_consumers(repo)

    newest = publish(MODEL, onnx, repo, None)
    check_served_and_consistent(repo, may_serve)
    assert Rollout(MODEL, repo).state().primary == newest

    rollout = Rollout(MODEL, repo)
    done = rollback(rollout, rollback_plan(rollout, None))
    check_served_and_consistent(repo, may_serve | {newest})
    assert Rollout(MODEL, repo).state().primary == done.target
    history = VersionStore(repo).history(MODEL)
    if point not in ("recorded", "saved"):
        assert any(e["action"] == "recover" for e in history), "the interrupted step was not noticed"


KEY = "crash-consistency-key"


@pytest.fixture(scope="module")
def explicit(built_artifacts, tmp_path_factory):
    """One explicit-mode server on private copies of the repositories; each test starts from its current primary."""
    root = tmp_path_factory.mktemp("explicit")
    repo, ensembles = repository_copies(root)
    server = triton_server([repo, ensembles], model_control_mode="explicit", admin_key=KEY,
                           log_path=root / "triton.log")
    with server:
        yield server, repo, ensembles


def test_a_rollback_killed_before_the_server_loaded_the_consumers_is_done_again_by_the_next_one(
        explicit, built_artifacts, german_credit_data):
    server, repo, ensembles = explicit
    first = Rollout(MODEL, repo).state().primary
    second = publish(MODEL, built_artifacts["onnx"], repo, None, url=server.http_url, key=KEY)
    client = grpc.InferenceServerClient(server.grpc_url)
    probe = payloads(german_credit_data, 50, "probe")
    env = {**os.environ, ADMIN_KEY_ENV: KEY}
    command = [str(S2T), "rollback", MODEL, "--yes", "--json", "--repository", str(repo), "--http-url", server.http_url]
    with Load(server.grpc_url, payloads(german_credit_data, 50, "load")) as load:
        # Every consumer's file names the first version again, and the server was asked to load none of them.
        killed = subprocess.run(command, env={**env, ENVIRONMENT_VARIABLE: "control.consumer.risk_pipeline_ensemble=kill"},
                                capture_output=True, text=True, timeout=120)
        assert killed.returncode == -9, killed.stderr[-2000:]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert (json.loads(done.stdout)["serving"], json.loads(done.stdout)["previous"]) == (first, second)
        routed = infer(client, "risk_router", probe)["served_by"]
    client.close()
    assert load.failures == [], (len(load.failures), sorted(set(load.failures))[:5])
    assert set(routed) == {f"{MODEL}:{first}"}
    # Every consumer runs, live, the config its file holds, and the version it names is loaded.
    rollout = Rollout(MODEL, repo, (ensembles,), server.http_url, KEY)
    planned = primary.plan(MODEL, first, rollout.repositories)
    running = live_configs(server.http_url, [c.name for c in planned])
    assert {c.name for c in planned if c.in_force(running.get(c.name, {}))} == set(CONSUMERS)
    assert all(c.text == c.path.read_text() for c in planned)
    status = grpc.InferenceServerClient(server.grpc_url)
    assert status.is_model_ready(MODEL, str(first))
    status.close()
    assert [e["action"] for e in VersionStore(repo).history(MODEL)][-3:] == ["rollback", "recover", "rollback"]


def test_a_supervisor_reload_cannot_undo_a_promote_made_while_it_runs(explicit, built_artifacts, german_credit_data):
    """The supervisor's explicit-mode reload posts the live config back; a promote between its fetch and its post
    would be undone. The hook runs at that moment: if nothing keeps the promote out, it runs whole there."""
    server, repo, ensembles = explicit
    rollout = Rollout(MODEL, repo, (ensembles,), server.http_url, KEY)
    staged = publish(MODEL, built_artifacts["onnx"], repo, None, stage=True, url=server.http_url, key=KEY)
    store = VersionStore(repo)
    reloader = Reloader(server.http_url, explicit=True, admin_headers=admin_headers(KEY), control_lock=store.lock)
    promoted = []
    promoting = threading.Thread(target=lambda: promoted.append(promote(rollout, staged)))

    def lock_free() -> bool:
        try:
            with store.lock(timeout=0):
                return True
        except ControlLockTimeout:
            return False

    def promote_meanwhile(model):
        free = lock_free()
        promoting.start()
        if free:
            promoting.join(300)

    reloader.config_fetched = promote_meanwhile
    client = grpc.InferenceServerClient(server.grpc_url)
    probe = payloads(german_credit_data, 50, "probe")
    with Load(server.grpc_url, payloads(german_credit_data, 50, "load")) as load:
        reloader.reload("risk_router", [])
        promoting.join(300)
        routed = infer(client, "risk_router", probe)["served_by"]
    client.close()
    assert promoted == [staged]
    assert set(routed) == {f"{MODEL}:{staged}"}, "the reload put the old primary back"
    router = live_configs(server.http_url, ["risk_router"])["risk_router"]
    assert router["parameters"]["primary"]["string_value"] == f"{MODEL}:{staged}"
    assert load.failures == [], (len(load.failures), sorted(set(load.failures))[:5])


def test_a_supervisor_reload_waits_for_the_lock_and_heals_where_no_control_area_can_be_written(explicit):
    server, repo, _ = explicit
    store = VersionStore(repo)

    def reload_marker() -> str:
        return live_configs(server.http_url, ["risk_router"])["risk_router"]["parameters"].get(
            RELOAD_PARAMETER, {}).get("string_value", "")

    before = reload_marker()
    waiting = Reloader(server.http_url, explicit=True, admin_headers=admin_headers(KEY),
                       control_lock=lambda timeout: store.lock(timeout=0.2))
    with store.lock():  # a rollout step holding it longer than the reload waits
        with pytest.raises(OSError, match="cannot take the control lock"):
            waiting.reload("risk_router", [])
    assert reload_marker() == before, "nothing was posted while the step held the lock"

    def unwritable(timeout):
        raise PermissionError(13, "Read-only file system", str(store.lock_file))

    Reloader(server.http_url, explicit=True, admin_headers=admin_headers(KEY),
             control_lock=unwritable).reload("risk_router", [])
    assert reload_marker() not in ("", before), "a read-only control area must not stop healing"
    client = grpc.InferenceServerClient(server.grpc_url)
    assert client.is_model_ready("risk_router")
    client.close()
