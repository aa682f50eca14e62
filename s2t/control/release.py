"""A release: what a Kubernetes or KServe pod copies from object storage, named by its content.

    <out>/<id>/model_repository/  ensembles/  src/

`src/` holds every module of this project that the python models and the keeper import, found by following their
imports (so a new import cannot be forgotten), the generated wire-format code included. The id is a digest of
every file's path and bytes: the same tree always gets the same id, any change a new one, and a manifest that
names it can never be pointed at other content.
"""
from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from s2t.atomic_files import durable_rename
from s2t.project_imports import MissingModuleError, installed_path, module_file, project_files
from s2t.errors import S2TError

# The container entry point (s2t/serve/keeper.py) runs from the release too.
ENTRY_MODULES = ("s2t.serve.keeper",)
ID_PATTERN = re.compile(r"sha256-[0-9a-f]{16}")
# Where manifests name a release: `releases/<id>` in these files under deploy/kubernetes.
PINNED_FILES = ("base/kustomization.yaml", "kserve/inferenceservice.yaml", "kserve/inferenceservice-grpc.yaml",
                "kserve/inferenceservice-openai.yaml")
_RELEASE_REFERENCE = re.compile(r"(releases/)[^\s\"']+")


class ReleaseError(S2TError, RuntimeError):
    pass


def _tree_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def build(root: Path, repositories: list[Path], out: Path) -> str:
    """Assemble the release under `out/<id>/` and return the id."""
    root = Path(root).resolve()
    models = [p for repo in repositories for p in Path(repo).glob("*/[0-9]*/model.py")]
    entries = [module_file(root, module) for module in ENTRY_MODULES]
    if None in entries:
        raise ReleaseError(f"an entry module of {ENTRY_MODULES} is missing")
    try:
        src = project_files(root, models + entries) | set(entries)
    except MissingModuleError as err:
        raise ReleaseError(str(err)) from None
    layout = {f"src/{installed_path(root, p).as_posix()}": p for p in src}
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
