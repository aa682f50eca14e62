"""The unit level runs on a fresh clone: nothing here reads what `make models` builds, the stand-ins take the
places of every built file the models read, and they fit the configs as the real ones do."""
import ast
import re
from pathlib import Path

from s2t.gate.model_config import check_repositories
from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent
# tests/conftest.py's paths to what `make models` builds.
BUILT_PATH_NAMES = ("ARTIFACTS", "DATA_CSV", "SAVED_MODEL", "SCORER_ONNX")


def test_no_unit_test_names_a_path_that_make_models_builds():
    offenders = []
    for path in sorted(HERE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(" + "|".join(BUILT_PATH_NAMES) + r")\b", line) and "BUILT_PATH_NAMES" not in line:
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == [], "unit tests take the stand-ins (tests/unit/conftest.py) instead:\n" + "\n".join(offenders)


def test_the_unit_fixtures_are_stand_ins_outside_the_checkout(built_artifacts, repositories):
    for path in (built_artifacts["onnx"], built_artifacts["data"], *repositories.values()):
        assert not Path(path).resolve().is_relative_to(ROOT), path
    assert built_artifacts["saved_model"] is None, "unit tests never run the TensorFlow model"


def test_every_file_the_makefile_builds_into_a_repository_has_a_stand_in(repositories):
    """The Makefile's variables for files inside the repositories (specs, drift reference, reason model)."""
    makefile = (ROOT / "Makefile").read_text()
    built = re.findall(r"^[A-Z_]+ := ((?:model_repository\w*)/[\w/.]+)$", makefile, re.M)
    assert len(built) >= 4, built
    for relative in built:
        repository, rest = relative.split("/", 1)
        assert (repositories[repository] / rest).is_file(), relative
    for scorer in ("risk_scorer", "risk_scorer_lite"):
        assert (repositories["model_repository"] / scorer / "1" / "model.onnx").is_file()


def test_the_stand_in_repositories_pass_the_config_check(repositories):
    assert check_repositories([repositories["model_repository"], repositories["ensembles"]]) == []


def _fixtures(path: Path) -> dict[str, set[str]]:
    """The fixtures a conftest defines, each with the fixtures it takes."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            found[node.name] = {a.arg for a in node.args.args}
    return found


def test_every_shared_fixture_that_reads_the_built_artifacts_has_its_unit_stand_in():
    """A session fixture of tests/conftest.py computed for a unit test would stay cached, stand-ins and all, for the
    integration tests of the same run (`make test-python` runs both levels at once)."""
    root = _fixtures(ROOT / "tests" / "conftest.py")
    reads, grew = {"built_artifacts"}, True
    while grew:
        more = {name for name, takes in root.items() if takes & reads} - reads
        reads, grew = reads | more, bool(more)
    assert reads - set(_fixtures(HERE / "conftest.py")) == set()


def _rule(makefile: str, target: str) -> tuple[list[str], list[str]]:
    """A Makefile rule's prerequisites and recipe lines."""
    match = re.search(rf"^{target}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, f"no rule for {target}"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_test_runs_lint_then_unit_then_the_rest_and_the_fast_levels_build_no_model():
    makefile = (ROOT / "Makefile").read_text()
    _, recipe = _rule(makefile, "test")
    # lint alone; the unit level beside the integration level's builds; then the integration level.
    first_goals = [word for word in recipe[0].split()[1:] if not word.startswith("-")]
    assert first_goals[0] == "lint"
    assert [line.split()[-1] for line in recipe[1:]] == ["integration-builds", "integration"]
    assert recipe[1].split()[-2] == "unit"
    # What the unit level and the legacy models' training need is made before them, so that they take a job slot at
    # once instead of queueing behind the other builds for one.
    made_first = set(first_goals) | set(_rule(makefile, "lint")[0])
    assert set(_rule(makefile, "unit")[0]) <= made_first
    # The stub the unit level runs links libpython, and xllamacpp loads libgomp: on a minimal Debian neither is there
    # until the native builds bring them, which the unit level runs beside.
    assert "runtime-libraries" in _rule(makefile, "unit")[0] and "runtime-libraries" in _rule(makefile, "serve")[0]
    training = re.search(r"^\S+:([^|\n]*)[^\n]*\n\t[^\n]*legacy build --out", makefile, re.M).group(1).split()
    assert set(training) - {"s2t/models/legacy_model.py"} <= made_first, training
    for level in ("lint", "unit"):
        prerequisites, _ = _rule(makefile, level)
        assert "models" not in prerequisites and not any(p.startswith("$(VENV)/.installed-test") for p in prerequisites)
    assert "models" in _rule(makefile, "integration")[0]
    # Beside the unit level nothing writes into a model repository, which unit tests read (the release's content
    # id, copies of the repositories): the repositories' own files come with `models`, after it.
    builds, _ = _rule(makefile, "integration-builds")
    variables = dict(re.findall(r"^([A-Z_]+) := (.+)$", makefile, re.M))
    paths = [variables.get(p[2:-1], p) if p.startswith("$(") else p for p in builds]
    assert "models" not in builds and not [p for p in paths if p.startswith("model_repository")], paths
    assert re.search(r"^make test\b", (ROOT / ".ci" / "run").read_text(), re.M), ".ci/run runs what the README says"


def test_the_integration_level_keeps_the_files_in_collection_order_on_its_workers():
    # Without it xdist's loadfile sorts the files by their number of tests and LONGEST_FIRST orders nothing.
    _, recipe = _rule((ROOT / "Makefile").read_text(), "integration")
    assert any("--dist loadfile" in line and "--no-loadscope-reorder" in line for line in recipe), recipe


def test_the_integration_modules_started_first_exist_each_named_once():
    from tests.integration.conftest import LONGEST_FIRST

    assert [path for path in LONGEST_FIRST if not Path(path).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_every_environment_is_installed_by_uv_trusting_the_machines_certificates():
    """uv's own certificate bundle refuses a package index behind a proxy whose authority only the machine's store
    holds (pip, and every tool the machine configures, trust that store): each install goes through UV_INSTALL, which
    loads it. The GPU venv alone is pip's (NVIDIA's index beside PyPI)."""
    makefile = (ROOT / "Makefile").read_text()
    uv_install = re.search(r"^UV_INSTALL := (.+)$", makefile, re.M).group(1).split()
    assert uv_install[:3] == ["$(BIN)/uv", "pip", "install"] and "--system-certs" in uv_install
    recipes = [line.strip() for line in makefile.splitlines() if line.startswith("\t")]
    installs = [line for line in recipes if "pip install" in line or "$(UV_INSTALL)" in line]
    assert sum("$(UV_INSTALL)" in line for line in installs) >= 5, installs
    others = [line for line in installs if "$(UV_INSTALL)" not in line]
    assert all(re.search(r"\$\(BIN\)/pip install .* uv$", line) or "$(GPU_VENV)/bin/pip" in line
               for line in others), others
