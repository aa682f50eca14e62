#!/usr/bin/env bash
# Builds the HTTP front of the embedded tritonserver (native/http_front.cc), `native/build_http_front.sh [DIR]`, by
# default into s2t/serve/native/, where `s2t serve` finds it, when a source is newer: libs2t_http_front.so, which the
# preloaded hook (native/grpc_front_hook.c) opens inside tritonserver. Needs g++, ccache, libevent-dev (its HTTP server
# and client), rapidjson-dev and zlib1g-dev, installed with apt where missing. It links Debian's shared libevent (its
# static archive is not position-independent), so it needs libevent-2.1-7 where it runs; tritonserver exports no
# libevent symbols of its own (it links libevhtp inside itself), and the hook opens the library with its symbols kept to
# itself. RapidJSON is headers only.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-s2t/serve/native}
library=$dir/libs2t_http_front.so
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v ccache >/dev/null || missing+=(ccache)
dpkg -s libevent-dev >/dev/null 2>&1 || missing+=(libevent-dev)
dpkg -s rapidjson-dev >/dev/null 2>&1 || missing+=(rapidjson-dev)
dpkg -s zlib1g-dev >/dev/null 2>&1 || missing+=(zlib1g-dev)
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
libdir=/usr/lib/$(gcc -print-multiarch)
sources=(native/http_front.cc native/http_front_infer.h native/front_options.h native/triton_c_api.h
  native/build_http_front.sh native/compiler_cache.sh "$libdir/libevent_core.so" "$libdir/libevent_extra.so")
stale=$([ -f "$library" ] || echo missing)
for source in "${sources[@]}"; do [ ! -e "$source" ] || [ "$source" -nt "$library" ] && stale=newer; done
[ -n "$stale" ] || exit 0
source native/compiler_cache.sh
mkdir -p "$dir" artifacts/native
object=artifacts/native/http_front.o
trap 'rm -f "$object"' EXIT
# Only the three entry points are exported; Triton's C API is resolved from tritonserver's process when loaded.
ccache g++ -std=c++17 -O2 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -fvisibility-inlines-hidden \
  -c native/http_front.cc -o "$object"
g++ -shared "$object" -o "$library.tmp" -levent_extra -levent_core -lz -pthread -s
mv "$library.tmp" "$library"
echo "built $library"
