#!/usr/bin/env bash
# Builds the gRPC front of the embedded tritonserver (native/grpc_front.cc) both ways, `native/build_grpc_front.sh
# [DIR]`, by default into s2t/serve/native/, where `s2t serve` finds them, when a source or Debian's gRPC library is
# newer: libs2t_grpc_front.so and its hook libs2t_grpc_front_hook.so (native/grpc_front_hook.c), which run it inside
# tritonserver, and the s2t_grpc_front binary (its own process). Needs g++, pkg-config and Debian's gRPC
# (libgrpc++-dev, 1.51 on Debian 12), installed with apt where missing. The binary links gRPC and its dependencies
# statically: it needs only the C and C++ runtimes. The library links Debian's shared gRPC libraries (Debian's static
# Abseil and RE2 cannot go into a shared object), so it needs libgrpc++1.51 where it runs; the hook opens it with its
# symbols kept to itself. An upgraded libgrpc++-dev makes the next build relink.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-s2t/serve/native}
out=$dir/s2t_grpc_front library=$dir/libs2t_grpc_front.so hook=$dir/libs2t_grpc_front_hook.so
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
dpkg -s libgrpc++-dev >/dev/null 2>&1 || missing+=(libgrpc++-dev)
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
sources=(native/grpc_front.cc native/grpc_front_hook.c native/model_infer_wire.h native/triton_c_api.h
  native/build_grpc_front.sh "$(pkg-config --variable=libdir grpc)/libgrpc.a")
stale=
for built in "$out" "$library" "$hook"; do
  [ -f "$built" ] || stale=missing
  for source in "${sources[@]}"; do [ "$source" -nt "$built" ] && stale=newer; done
done
[ -n "$stale" ] || exit 0
# pkg-config names libatomic inside --as-needed brackets and librt: both stay shared, as glibc's own are.
libs=$(pkg-config --static --libs grpc++ | sed 's/-Wl,--push-state,--as-needed -latomic -Wl,--pop-state//; s/ -lrt\b//g')
mkdir -p "$dir"
g++ -std=c++17 -O2 -Wall -Wextra -Werror $(pkg-config --cflags grpc++) native/grpc_front.cc -o "$out.tmp" \
  -Wl,-Bstatic $libs -Wl,-Bdynamic -latomic -lrt -pthread -s
# Only the three entry points are exported; Triton's C API is resolved from tritonserver's process when loaded.
g++ -std=c++17 -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -DS2T_IN_TRITONSERVER \
  $(pkg-config --cflags grpc++) native/grpc_front.cc -o "$library.tmp" $(pkg-config --libs grpc++) -pthread -s
gcc -O2 -Wall -Wextra -Werror -shared -fPIC native/grpc_front_hook.c -o "$hook.tmp" -ldl -s
mv "$out.tmp" "$out"
mv "$library.tmp" "$library"
mv "$hook.tmp" "$hook"
echo "built $out, $library and $hook"
