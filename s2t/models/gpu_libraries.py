"""`python -m s2t.models.gpu_libraries`: LD_LIBRARY_PATH for the CUDA libraries that PyPI's nvidia-* wheels install.

onnxruntime-gpu loads cuBLAS, cuDNN, cuFFT and cuRAND by name and ships none of them; TensorRT and Polygraphy need
libcudart. The CUDA 12 wheels put each under site-packages/nvidia/<name>/lib, the CUDA 13 ones all under
site-packages/nvidia/cu13/lib, in .venv and .venv-gpu (s2t/models/serving_image.py lists them).
"""
from __future__ import annotations

import glob
import os


def library_dirs() -> list[str]:
    try:
        import nvidia
    except ImportError:
        return []
    return sorted({d for root in nvidia.__path__ for d in glob.glob(os.path.join(root, "*", "lib"))})


def ld_library_path() -> str:
    """The wheels' library dirs first, then LD_LIBRARY_PATH as it was, each once."""
    current = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return ":".join(dict.fromkeys(library_dirs() + current))


if __name__ == "__main__":
    print(ld_library_path())
