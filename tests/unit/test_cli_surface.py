import re
import subprocess

from click.testing import CliRunner

from tests.conftest import ROOT
from tools.cli import main


def test_version_prints_one_line_with_the_version_number():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert re.fullmatch(r"s2t \d+\.\d+\.\d+\n", result.output)


def test_make_refuses_an_unsupported_python_with_a_clear_message(tmp_path):
    result = subprocess.run(["make", "-s", "venv", "PYTHON=", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs Python 3.11 or 3.12" in result.stderr
    assert not (tmp_path / "venv").exists()
