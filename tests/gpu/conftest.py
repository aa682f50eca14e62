"""GPU tests skip cleanly, naming what is missing, wherever there is no GPU or no GPU wheels (`make test` here)."""
import pytest

from s2t.models import tensorrt_engine


def missing_for_gpu_tests() -> str | None:
    try:
        tensorrt_engine.cuda_device()
        tensorrt_engine.import_tensorrt()
    except tensorrt_engine.EngineBuildError as err:
        return str(err)
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDA execution provider (`make gpu-venv`)"
    return None


MISSING = missing_for_gpu_tests()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            if MISSING:
                item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {MISSING}"))
