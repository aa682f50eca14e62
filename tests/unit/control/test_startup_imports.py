"""What a rollback imports before its live switch: the modules that ask the server bring tritonclient (and numpy,
gevent, grpc with it) only when a step first asks."""
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("tritonclient", "numpy", "gevent", "grpc")


def test_the_modules_that_ask_the_server_import_no_client_library_until_they_ask():
    shown = subprocess.run(
        [sys.executable, "-c", "import sys\nimport s2t.control.live_control, s2t.control.reachability\n"
                               f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == []
