"""This project's modules as they import each other, read from the source (nothing is imported).

A release ships what the python models and the keeper reach by import (`s2t/control/release.py`), the image check
follows the same imports to the third-party modules (`s2t/gate/runtime_imports.py`), and the architecture test holds
every edge against the layers. Imports inside functions count: that is how the protobuf code is reached.
"""
from __future__ import annotations

import ast
from pathlib import Path

# The one top-level package the project installs.
PROJECT_PACKAGES = ("s2t",)
# Its packages whose sources live at the top level of the repository (setup.py's package_dir, the same mapping):
# package -> its folder.
PACKAGE_DIRS = {"s2t.backends": "backends", "s2t.clients": "clients"}


class MissingModuleError(RuntimeError):
    pass


def module_file(root: Path, module: str) -> Path | None:
    """The source file of `module` in the checkout at `root`; None when there is none."""
    parts = module.split(".")
    path = root.joinpath(*parts)
    for package, folder in PACKAGE_DIRS.items():
        if parts[:package.count(".") + 1] == package.split("."):
            path = root.joinpath(folder, *parts[package.count(".") + 1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def installed_path(root: Path, source: Path) -> Path:
    """Where a source file of the checkout at `root` lies in an install of the package (site-packages, a release's
    src/): the mapped folders under their package."""
    relative = source.relative_to(root)
    for package, folder in PACKAGE_DIRS.items():
        if relative.parts[0] == folder:
            return Path(*package.split("."), *relative.parts[1:])
    return relative


def source_module(root: Path, source: Path) -> str | None:
    """The module a .py file of the checkout at `root` is; None outside the project's packages."""
    parts = installed_path(root, source).with_suffix("").parts
    if parts[0] not in PROJECT_PACKAGES:
        return None
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_project_modules(source: Path) -> tuple[set[str], set[str]]:
    """(modules that must exist, names that may be modules) of the project that a file imports, at any depth."""
    required, maybe = set(), set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            required |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            required.add(node.module)
            maybe |= {f"{node.module}.{alias.name}" for alias in node.names}
    project = {name for name in required | maybe if name.split(".")[0] in PROJECT_PACKAGES}
    return required & project, maybe & project


def project_files(root: Path, starts: list[Path]) -> set[Path]:
    """The project's .py files reachable by import from `starts`, with the packages' __init__.py on the way."""
    todo, files = list(starts), set()
    while todo:
        source = todo.pop()
        required, maybe = imported_project_modules(source)
        for module in required | maybe:
            parts = module.split(".")
            for depth in range(1, len(parts) + 1):
                found = module_file(root, ".".join(parts[:depth]))
                if found is None and module in required and depth == len(parts):
                    raise MissingModuleError(
                        f"{source.relative_to(root) if source.is_relative_to(root) else source} imports {module}, "
                        "which is missing (`make proto` generates the wire format's modules)")
                if found is not None and found not in files:
                    files.add(found)
                    todo.append(found)
    return files
