"""A release: what a Kubernetes or KServe pod copies from object storage, named by its content.

    <out>/<id>/model_repository/  ensembles/  src/

`src/` holds every module of this project that the python models and the keeper import, found by following their
imports (so a new import cannot be forgotten), the generated wire-format code included. The id is a digest of
every file's path and bytes: the same tree always gets the same id, any change a new one, and a manifest that
names it can never be pointed at other content.
"""
from __future__ import annotations

import ast
import hashlib
import re
import shutil
from pathlib import Path

from backends.atomic_files import durable_rename

PROJECT_PACKAGES = ("backends", "clients", "s2t", "servers", "wire")
# The container entry point (s2t/serve/keeper.py) runs from the release too.
ENTRY_MODULES = ("s2t.serve.keeper",)
ID_PATTERN = re.compile(r"sha256-[0-9a-f]{16}")
# Where manifests name a release: `releases/<id>` in these files under deploy/kubernetes.
PINNED_FILES = ("base/kustomization.yaml", "kserve/inferenceservice.yaml", "kserve/inferenceservice-grpc.yaml",
                "kserve/inferenceservice-openai.yaml")
_RELEASE_REFERENCE = re.compile(r"(releases/)[^\s\"']+")


class ReleaseError(RuntimeError):
    pass


def _module_file(root: Path, module: str) -> Path | None:
    path = root.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_project_modules(source: Path) -> tuple[set[str], set[str]]:
    """(modules that must exist, names that may be modules) of the project that a file imports, at any depth
    (imports inside functions count: that is how the protobuf code is reached)."""
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
                found = _module_file(root, ".".join(parts[:depth]))
                if found is None and module in required and depth == len(parts):
                    raise ReleaseError(f"{source.relative_to(root) if source.is_relative_to(root) else source} "
                                       f"imports {module}, which is missing (`make proto` generates the wire "
                                       "format's modules)")
                if found is not None and found not in files:
                    files.add(found)
                    todo.append(found)
    return files


def _tree_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def build(root: Path, repositories: list[Path], out: Path) -> str:
    """Assemble the release under `out/<id>/` and return the id."""
    root = Path(root).resolve()
    models = [p for repo in repositories for p in Path(repo).glob("*/[0-9]*/model.py")]
    entries = [_module_file(root, module) for module in ENTRY_MODULES]
    if None in entries:
        raise ReleaseError(f"an entry module of {ENTRY_MODULES} is missing")
    src = project_files(root, models + entries) | set(entries)
    layout = {f"src/{p.relative_to(root)}": p for p in src}
    for repo in repositories:
        repo = Path(repo).resolve()
        layout.update({f"{repo.name}/{p.relative_to(repo)}": p for p in _tree_files(repo)})
    digest = hashlib.sha256()
    for name in sorted(layout):
        digest.update(name.encode() + b"\0" + layout[name].read_bytes() + b"\0")
    release_id = f"sha256-{digest.hexdigest()[:16]}"
    target = Path(out) / release_id
    if target.exists():
        return release_id  # same content, same id: already built
    staging = Path(out) / f".{release_id}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    for name, source in layout.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, staging / name)
    durable_rename(staging, target)
    return release_id


def pin(kubernetes_dir: Path, release_id: str) -> list[Path]:
    """Point every manifest's release reference at `release_id`; the files changed."""
    if not ID_PATTERN.fullmatch(release_id):
        raise ReleaseError(f"not a release id: {release_id!r}")
    changed = []
    for name in PINNED_FILES:
        path = Path(kubernetes_dir) / name
        text = path.read_text()
        pinned = _RELEASE_REFERENCE.sub(rf"\g<1>{release_id}", text)
        if pinned != text:
            path.write_text(pinned)
            changed.append(path)
    return changed
