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
