#!/usr/bin/env bash
# Builds the gRPC front of the embedded tritonserver (native/grpc_front.cc) both ways, `native/build_grpc_front.sh
# [DIR]`, by default into s2t/serve/native/, where `s2t serve` finds them, when a source or Debian's gRPC or protobuf
# library is newer: libs2t_grpc_front.so and its hook libs2t_grpc_front_hook.so (native/grpc_front_hook.c), which run
# it inside tritonserver, and the s2t_grpc_front binary (its own process). Needs g++, pkg-config, ccache, Debian's
# gRPC (libgrpc++-dev, 1.51 on Debian 12) and protobuf (protobuf-compiler and libprotobuf-dev, 3.21), installed
# through tools/debian_packages.sh where missing. protoc makes the message classes from Triton's own .proto files
# (native/proto, Triton 2.51's, from triton-inference-server/common r24.10) in artifacts/native/, removed after.
# The binary links gRPC, protobuf and their dependencies statically: it needs only the C and C++ runtimes. The
# library links Debian's shared gRPC and protobuf libraries (Debian's static Abseil and RE2 cannot go into a shared
# object), so it needs libgrpc++1.51 and libprotobuf32 where it runs; the hook opens it with its symbols kept to
# itself (tritonserver exports no gRPC or protobuf symbols of its own to bind to). An upgraded libgrpc++-dev or
# libprotobuf-dev makes the next build relink.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-s2t/serve/native}
out=$dir/s2t_grpc_front library=$dir/libs2t_grpc_front.so hook=$dir/libs2t_grpc_front_hook.so
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v ccache >/dev/null || missing+=(ccache)
for package in libgrpc++-dev protobuf-compiler libprotobuf-dev; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
protos=(native/proto/grpc_service.proto native/proto/model_config.proto)
sources=(native/grpc_front.cc native/grpc_front_hook.c native/infer_request_check.h native/front_options.h
  native/triton_c_api.h "${protos[@]}" native/build_grpc_front.sh native/compiler_cache.sh
  "$(pkg-config --variable=libdir grpc)/libgrpc.a" "$(pkg-config --variable=libdir protobuf)/libprotobuf.a")
stale=
for built in "$out" "$library" "$hook"; do
  [ -f "$built" ] || stale=missing
  for source in "${sources[@]}"; do [ "$source" -nt "$built" ] && stale=newer; done
done
[ -n "$stale" ] || exit 0
source native/compiler_cache.sh
generated=artifacts/native/grpc_front
rm -rf "$generated" && mkdir -p "$generated"
trap 'rm -rf "$generated"' EXIT
protoc -Inative/proto --cpp_out="$generated" "${protos[@]}"
# The message classes are compiled once, position-independent and hidden, for the binary and the library alike.
flags=(-std=c++17 -O2 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -I"$generated" -Inative)
compiles=()
for proto in grpc_service model_config; do
  # protoc's code is not ours to make -Wextra-clean: only its own warnings are switched off, and only for it.
  ccache g++ "${flags[@]}" -Wno-unused-parameter $(pkg-config --cflags protobuf) -c "$generated/$proto.pb.cc" \
    -o "$generated/$proto.pb.o" &
  compiles+=($!)
done
ccache g++ "${flags[@]}" $(pkg-config --cflags grpc++ protobuf) -c native/grpc_front.cc -o "$generated/front.o" &
compiles+=($!)
ccache g++ "${flags[@]}" -DS2T_IN_TRITONSERVER $(pkg-config --cflags grpc++ protobuf) -c native/grpc_front.cc \
  -o "$generated/front_in_tritonserver.o" &
compiles+=($!)
wait_for_each "${compiles[@]}"
objects=("$generated/grpc_service.pb.o" "$generated/model_config.pb.o")
# pkg-config names libatomic inside --as-needed brackets and librt: both stay shared, as glibc's own are.
libs=$(pkg-config --static --libs grpc++ protobuf |
  sed 's/-Wl,--push-state,--as-needed -latomic -Wl,--pop-state//; s/ -lrt\b//g')
mkdir -p "$dir"
g++ "$generated/front.o" "${objects[@]}" -o "$out.tmp" -Wl,-Bstatic $libs -Wl,-Bdynamic -latomic -lrt -pthread -s
# Only the three entry points are exported; Triton's C API is resolved from tritonserver's process when loaded.
g++ -shared "$generated/front_in_tritonserver.o" "${objects[@]}" -o "$library.tmp" \
  $(pkg-config --libs grpc++ protobuf) -pthread -s
gcc -O2 -Wall -Wextra -Werror -shared -fPIC native/grpc_front_hook.c -o "$hook.tmp" -ldl -s
mv "$out.tmp" "$out"
mv "$library.tmp" "$library"
mv "$hook.tmp" "$hook"
echo "built $out, $library and $hook"
