"""Which third-party distributions the python models of a repository need where they run.

A container image has to install them; the python stub finds out only when a model loads. Following the models'
imports through this project's modules (those a release ships, `s2t.project_imports.project_files`) answers it before
then. Imports inside functions count (the engines are imported lazily), and so does a module looked up by name
with `importlib.util.find_spec("...")` or `importlib.import_module("...")` (how a data-only package is located).
"""
from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

from s2t.project_imports import PROJECT_PACKAGES, project_files

# Provided by Triton's python backend itself, in every image that has one.
BACKEND_MODULES = frozenset({"triton_python_backend_utils"})
# The Python of the NGC image the containers run (Ubuntu 24.04's since NGC 24.12, 25.08 included): the stubs import
# the python models' modules there, and the keeper runs there. The check itself runs on whatever Python this is.
IMAGE_PYTHON = (3, 12)
# Standard-library modules removed in a Python release (PEP 594 and earlier): on the image they need a
# distribution like any other, even where the Python checking still ships them.
REMOVED_FROM_STDLIB = {
    (3, 12): frozenset({"asynchat", "asyncore", "distutils", "imp", "smtpd"}),
    (3, 13): frozenset({"aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "lib2to3", "mailcap", "msilib",
                        "nis", "nntplib", "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu",
                        "xdrlib"}),
}
_LOOKUPS_BY_NAME = frozenset({"find_spec", "import_module"})


def model_files(repositories: list[Path]) -> list[Path]:
    return sorted(p for repo in repositories for p in Path(repo).glob("*/[0-9]*/model.py"))


def _imported_modules(source: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in _LOOKUPS_BY_NAME:
                found.add(node.args[0].value)
    return found


def stdlib_modules(python: tuple[int, int] = IMAGE_PYTHON) -> frozenset[str]:
    """The top-level standard-library modules of Python `python` (major, minor), as far as this one can tell: its
    own, less those removed by `python` (or earlier) that this one still has."""
    removed = set().union(*(names for version, names in REMOVED_FROM_STDLIB.items()
                            if sys.version_info[:2] < version <= tuple(python)))
    return frozenset(sys.stdlib_module_names) - removed


def third_party_modules(root: Path, starts: list[Path],
                        python: tuple[int, int] = IMAGE_PYTHON) -> dict[str, set[Path]]:
    """Modules (dotted, as imported) outside Python `python`'s standard library and this project -> the files that
    import them."""
    stdlib = stdlib_modules(python)
    modules: dict[str, set[Path]] = {}
    for source in sorted(set(starts) | project_files(Path(root), list(starts))):
        for module in _imported_modules(source):
            top = module.split(".")[0]
            if top not in stdlib and top not in PROJECT_PACKAGES:
                modules.setdefault(module, set()).add(source)
    return modules


def distribution_of(module: str) -> str | None:
    """The distribution (normalised name) that installs `module` in the current environment, or None. Several
    distributions can share a top-level namespace (`google`): the one whose files hold the module's path wins."""
    parts = module.split(".")
    candidates = importlib.metadata.packages_distributions().get(parts[0], [])
    for depth in range(len(parts), 0, -1):
        prefix = "/".join(parts[:depth])
        for name in candidates:
            files = importlib.metadata.distribution(name).files or []
            # A package folder, or a module file (`.py`, or an extension's `.cpython-...so`).
            if any(str(f).startswith((f"{prefix}/", f"{prefix}.")) for f in files):
                return normalised(name)
    return None


def normalised(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")
