"""`python -m s2t.models.serving_image`: the serving image, what it runs, and the GPU wheels that must match it.

A TensorRT engine deserializes only in the TensorRT release that built it, so `s2t build-trt` must run the image's
TensorRT; the in-process comparisons of `s2t parity --engine` and `s2t bench --mode gpu` should run the image's
ONNX Runtime release. This module is where those versions live: tensorrt_engine reads them, `make gpu-venv` installs
what `python -m s2t.models.serving_image` prints (one requirement a line), and docs/tensorrt.md cites the source of
each version.
"""
from __future__ import annotations

from dataclasses import dataclass

from s2t.errors import S2TError


@dataclass(frozen=True)
class NgcRelease:
    """What one NGC tritonserver `-py3` image ships, as its release notes and the Triton repositories give it."""

    triton: str
    cuda: str
    tensorrt: str       # the full version: an engine loads only in this exact release
    onnxruntime: str    # the ONNX Runtime its onnxruntime backend is built with
    cudnn: str
    python: str
    gpu_wheels: tuple[str, ...]  # what `make gpu-venv` installs for this image, one pinned requirement each

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


RELEASES = {
    "25.08": NgcRelease(
        triton="2.60.0", cuda="13.0.0", tensorrt="10.13.2.6", onnxruntime="1.23.0", cudnn="9.12.0.46", python="3.12",
        gpu_wheels=(
            # TensorRT's CUDA 13 build, as in the image. On PyPI it is a stub that fetches the libraries from
            # pypi.nvidia.com at install time (TRT_INDEX in the Makefile).
            "tensorrt-cu13==10.13.2.6",
            # CUDA 13.0.0's runtime (libcudart.so.13, under nvidia/cu13/lib), for TensorRT and Polygraphy. Pinned
            # here because the stub's own dependencies are only known once pypi.nvidia.com has been reached.
            "nvidia-cuda-runtime==13.0.48",
            # The image's ONNX Runtime release. PyPI's onnxruntime-gpu 1.23.0 is built for CUDA 12 (the image's is
            # built for CUDA 13): same release, other CUDA build. It loads cuDNN 9, cuBLAS, cuFFT and cuRAND of
            # CUDA 12 by name and ships none of them: cuDNN at the image's release, the rest from CUDA 12.9
            # update 1, the CUDA 12 runtime .venv already pins (nvidia-cuda-runtime-cu12 12.9.79).
            "onnxruntime-gpu==1.23.0",
            "nvidia-cudnn-cu12==9.12.0.46",
            "nvidia-cublas-cu12==12.9.1.4",
            "nvidia-cufft-cu12==11.4.1.4",
            "nvidia-curand-cu12==10.3.10.19",
            "nvidia-nvjitlink-cu12==12.9.86",
        )),
}

# The image deploy/triton builds on (25.07 / Triton 2.59.1 is the first with the fixes for
# CVE-2025-23319/23320/23334).
SERVING_IMAGE = "nvcr.io/nvidia/tritonserver:25.08-py3"


class UnknownImageError(S2TError):
    """The image has no entry in RELEASES: its TensorRT, and so the engines it loads, are not known here."""


def image_tag(image: str) -> str:
    """`nvcr.io/nvidia/tritonserver:25.08-py3` -> `25.08`."""
    _, _, tag = image.rpartition(":")
    return tag.split("-", 1)[0]


def release_of(image: str) -> NgcRelease:
    tag = image_tag(image)
    if tag not in RELEASES:
        raise UnknownImageError(
            f"{image}: release {tag!r} is not in s2t/models/serving_image.py RELEASES ({', '.join(sorted(RELEASES))}); "
            "add its TensorRT, CUDA and ONNX Runtime versions from its release notes before building engines for it")
    return RELEASES[tag]


def same_release(installed: str, pinned: str) -> bool:
    """True when `installed` is the `pinned` version, component by component (a `.postN` repackaging included).

    Component-wise, not a text prefix: 10.13.2.60 is not 10.13.2.6.
    """
    wanted = pinned.split(".")
    return installed.split(".")[:len(wanted)] == wanted


if __name__ == "__main__":
    print("\n".join(release_of(SERVING_IMAGE).gpu_wheels))
