"""The top-level layout with one installed package: setup.py's package_dir and s2t/project_imports.py PACKAGE_DIRS
say the same, every source file of a mapped folder is the module its path says, as this interpreter imports it (the
checkout's finder in s2t/__init__.py), a checkout maps only those packages, and a folder an older layout left under
s2t/ cannot shadow them."""
from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import s2t
from s2t.project_imports import PACKAGE_DIRS, installed_path, module_file, source_module

ROOT = Path(__file__).resolve().parents[2]


def _setup_package_dirs() -> dict:
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = [node.value for node in tree.body if isinstance(node, ast.Assign)
             and any(getattr(t, "id", None) == "PACKAGE_DIRS" for t in node.targets)]
    assert len(found) == 1, "setup.py should define PACKAGE_DIRS once"
    return ast.literal_eval(found[0])


def test_setup_the_source_readers_and_the_checkouts_finder_map_the_same_packages_to_the_same_folders():
    assert _setup_package_dirs() == PACKAGE_DIRS
    assert {name: str(folder.relative_to(ROOT)) for name, folder in s2t._CHECKOUT_PACKAGES.items()} == PACKAGE_DIRS
    for package, folder in PACKAGE_DIRS.items():
        assert (ROOT / folder / "__init__.py").is_file(), folder
        assert not (ROOT / Path(*package.split(".")) / "__init__.py").exists(), f"{package} is also under s2t/"


def test_every_mapped_source_is_the_module_its_path_says_as_imported():
    for folder in PACKAGE_DIRS.values():
        sources = sorted(p for p in (ROOT / folder).rglob("*.py")
                         if "__pycache__" not in p.parts and p.name != "model.py")
        assert sources, folder
        for source in sources:
            module = source_module(ROOT, source)
            assert module is not None and module.startswith("s2t."), source
            assert module_file(ROOT, module) == source, module
            spec = importlib.util.find_spec(module)
            assert spec is not None and Path(spec.origin).resolve() == source.resolve(), (module, spec)


def test_a_checkout_maps_only_its_two_packages():
    assert list(s2t.__path__) == [str(ROOT / "s2t")]
    for name in ("s2t.setup", "s2t.tests", "s2t.native", "s2t.tools"):
        assert importlib.util.find_spec(name) is None, name


def test_a_folder_an_older_layout_left_under_s2t_does_not_shadow_the_mapped_packages(tmp_path):
    """git removes the tracked files of s2t/backends/, not the ignored __pycache__ beside them."""
    checkout = tmp_path / "checkout"
    for part in ("s2t", "backends", "clients"):
        (checkout / part).mkdir(parents=True)
    (checkout / "setup.py").write_text("")
    (checkout / "s2t" / "__init__.py").write_text((ROOT / "s2t" / "__init__.py").read_text())
    (checkout / "s2t" / "backends" / "__pycache__").mkdir(parents=True)
    (checkout / "backends" / "__init__.py").write_text("")
    (checkout / "backends" / "scoring.py").write_text("WHERE = 'top level'\n")
    (checkout / "clients" / "__init__.py").write_text("")
    code = "import sys; sys.path.insert(0, sys.argv[1]); import s2t.backends.scoring as m, s2t.clients; print(m.WHERE)"
    done = subprocess.run([sys.executable, "-S", "-c", code, str(checkout)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "top level"), done.stderr


def test_a_checkout_on_sys_path_without_the_install_imports_the_mapped_packages(tmp_path):
    """As the compose stack's containers use it (a .pth file or PYTHONPATH naming the checkout): no site directory,
    so no editable install."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import s2t.backends, s2t.clients, "
            "s2t.wire.names; print(s2t.backends.__file__, s2t.clients.__file__)")
    done = subprocess.run([sys.executable, "-S", "-c", code, str(ROOT)], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ROOT / "backends" / "__init__.py"), str(ROOT / "clients" / "__init__.py")]


def test_an_install_lays_the_mapped_folders_out_under_s2t():
    assert installed_path(ROOT, ROOT / "backends" / "records" / "record_decoder.py") == \
        Path("s2t/backends/records/record_decoder.py")
    assert installed_path(ROOT, ROOT / "s2t" / "cli" / "__init__.py") == Path("s2t/cli/__init__.py")
    assert source_module(ROOT, ROOT / "clients" / "__init__.py") == "s2t.clients"
    assert source_module(ROOT, ROOT / "tests" / "conftest.py") is None
