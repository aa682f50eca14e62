"""`s2t status` against the live server: models, versions with their live state and roles, the breaker."""
import json
import subprocess

from tests.conftest import MODEL_REPOSITORY, S2T
from s2t.control.version_store import VersionStore



def test_status_json_lists_the_scorer_and_the_pipeline_with_their_live_versions(triton):
    done = subprocess.run([str(S2T), "status", "--json", "--http-url", triton.http_url, "--repository",
                           str(MODEL_REPOSITORY), "--metrics-url", f"http://localhost:{triton.metrics_port}/metrics"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    models = json.loads(done.stdout)["models"]
    primary = VersionStore(MODEL_REPOSITORY).served("risk_scorer")[-1]
    scorer = models["risk_scorer"]
    assert scorer["primary"] == primary
    assert {"version": primary, "role": "primary", "folder": True, "state": "READY"} in scorer["versions"]
    assert scorer["consumers"] == {"risk_router": primary, "risk_pipeline": primary,
                                                    "risk_pipeline_ensemble": primary}
    assert models["risk_pipeline"]["versions"] == [{"version": 1, "role": "", "folder": True, "state": "READY"}]
    assert models["risk_router"]["split"] == f"100% risk_scorer:{primary}"
    assert models["risk_router"]["breaker"] in ("closed", "unknown")


def test_status_prints_the_supervisor_record_for_people_and_keeps_it_whole_in_json(tmp_path):
    from s2t.control.status import SUPERVISOR_FILE
    from s2t.serve.healing import SupervisorState
    from tests.integration.servers import repository_copies

    repo, _ = repository_copies(tmp_path)
    supervisor = SupervisorState(path=VersionStore(repo).control / SUPERVISOR_FILE)
    supervisor.server_started(4242)
    supervisor.record("reload", "risk_router", "stub_died")
    command = [str(S2T), "status", "--repository", str(repo), "--history", "0"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("supervisor:")):]
    assert lines[0].startswith("supervisor: server pid 4242, supervising since 20") and " ago)" in lines[0]
    assert "  reloads: risk_router (stub_died) x1" in lines
    assert "{" not in "\n".join(lines)
    as_json = subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(as_json.stdout)["supervisor"] == supervisor.to_dict()
