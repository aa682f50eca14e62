#!/usr/bin/env bash
# Issue 7's one prepared check for a GPU machine: engines, parity, publish and the GPU benchmark, well inside
# 10 minutes. Writes everything under $OUT (default bench/results/gpu-run). Needs what `make gpu-venv` installs
# (the serving image's TensorRT from pypi.nvidia.com, its ONNX Runtime release and CUDA libraries from PyPI:
# `python -m s2t.models.serving_image`) on top of `make venv`'s .venv; it says what is missing first rather than
# failing half-way.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-bench/results/gpu-run}
mkdir -p "$out"
{
  echo "== machine"; date -u; nvidia-smi -L || echo "nvidia-smi: no GPU driver"
  python3 --version
} 2>&1 | tee "$out/machine.txt"
if ! make gpu-venv >"$out/gpu-venv.log" 2>&1; then
  echo "cannot build .venv-gpu (see $out/gpu-venv.log): the GPU wheels come from PyPI and pypi.nvidia.com"
  tail -20 "$out/gpu-venv.log"
  exit 2
fi
status=0
LD_LIBRARY_PATH=$(.venv-gpu/bin/python -m s2t.models.gpu_libraries) timeout 420 .venv-gpu/bin/python -m pytest -m gpu \
  tests/gpu -rs -s -p no:cacheprovider --junitxml="$out/junit.xml" 2>&1 | tee "$out/pytest.txt" || status=1
LD_LIBRARY_PATH=$(.venv-gpu/bin/python -m s2t.models.gpu_libraries) timeout 150 .venv-gpu/bin/python -m s2t.cli \
  bench --mode gpu --out "$out" 2>&1 | tee "$out/bench.txt" || status=1
exit $status
