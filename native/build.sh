#!/usr/bin/env bash
# Builds the in-process backend (libtriton_s2t_inprocess.so) for one Python: `native/build.sh PYTHON [DIR]`, into DIR
# (by default s2t/serve/native/pythonX.Y/, where `s2t serve` finds it: one build per Python version, as it links that
# version's libpython), when a source is newer. Needs g++, ccache and the Python's headers and shared library
# (installed with apt where missing, for Debian's Pythons).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:?usage: native/build.sh PYTHON [DIR]}
read -r version include libdir soname shared < <("$python" -c 'import sysconfig as s; print(s.get_config_var("VERSION"),
  s.get_paths()["include"], s.get_config_var("LIBDIR"), s.get_config_var("INSTSONAME"), s.get_config_var("Py_ENABLE_SHARED"))')
out=${2:-s2t/serve/native/python$version}/libtriton_s2t_inprocess.so
sources=(native/python_inprocess.cc native/backend_common.h native/triton_c_api.h native/build.sh
  native/compiler_cache.sh)
stale=$([ -f "$out" ] || echo missing)
for source in "${sources[@]}"; do [ "$source" -nt "$out" ] && stale=newer; done
[ -n "$stale" ] || exit 0
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v ccache >/dev/null || missing+=(ccache)
[ -f "$include/Python.h" ] || missing+=("python$version-dev")
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
if [ "$shared" != 1 ]; then
  echo "$python has no shared libpython (built without --enable-shared): the in-process backend needs one" >&2
  exit 1
fi
source native/compiler_cache.sh
mkdir -p "$(dirname "$out")" artifacts/native
object=artifacts/native/python_inprocess-$version.o
trap 'rm -f "$object"' EXIT
ccache g++ -std=c++17 -O2 -Wall -Wextra -Werror -fPIC -I"$include" -DS2T_LIBPYTHON="\"$soname\"" \
  -c native/python_inprocess.cc -o "$object"
g++ -shared "$object" -L"$libdir" -lpython"$version" -Wl,-rpath,"$libdir" -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
