"""Bytecode written before Triton starts: current bytecode is never rewritten (a poll-mode server watches it)."""
import importlib.util
import os

from s2t.serve.triton_server import precompile_models


def write_model(repository, source="def answer():\n    return 1\n"):
    model_py = repository / "some_model" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text(source)
    return model_py


def test_current_bytecode_is_left_untouched_so_a_server_on_the_same_repository_reloads_nothing(tmp_path):
    model_py = write_model(tmp_path)
    precompile_models([tmp_path])
    pyc = importlib.util.cache_from_source(str(model_py))
    os.utime(pyc, ns=(1_000_000_000, 1_000_000_000))
    precompile_models([tmp_path])
    assert os.stat(pyc).st_mtime_ns == 1_000_000_000


def test_a_changed_model_gets_new_bytecode(tmp_path):
    model_py = write_model(tmp_path)
    precompile_models([tmp_path])
    pyc = importlib.util.cache_from_source(str(model_py))
    os.utime(pyc, ns=(1_000_000_000, 1_000_000_000))
    model_py.write_text("def answer():\n    return 22\n")
    os.utime(model_py, ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
    precompile_models([tmp_path])
    assert os.stat(pyc).st_mtime_ns != 1_000_000_000


def test_a_model_that_does_not_compile_is_left_to_triton_to_report(tmp_path):
    model_py = write_model(tmp_path, "def broken(:\n")
    precompile_models([tmp_path])
    assert not os.path.exists(importlib.util.cache_from_source(str(model_py)))
