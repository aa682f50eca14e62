#!/usr/bin/env bash
# Builds the libFuzzer target of the gRPC front's request checks, `native/fuzz/build.sh OUT`: clang with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (Debian 12's clang 14 links -fsanitize=fuzzer with the
# libclang-rt-14-dev it brings), against the message classes protoc makes from native/proto and Debian's protobuf.
# Rebuilt only when a source is newer. clang, ccache, protobuf-compiler and libprotobuf-dev installed through
# tools/debian_packages.sh where missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: native/fuzz/build.sh OUT}
missing=()
command -v clang++ >/dev/null || missing+=(clang)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v ccache >/dev/null || missing+=(ccache)
for package in protobuf-compiler libprotobuf-dev; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
protos=(native/proto/grpc_service.proto native/proto/model_config.proto)
sources=(native/fuzz/infer_request_fuzz.cc native/infer_request_check.h native/fuzz/build.sh native/compiler_cache.sh
  "${protos[@]}")
stale=
[ -f "$out" ] || stale=missing
for source in "${sources[@]}"; do [ "$source" -nt "$out" ] && stale=newer; done
[ -n "$stale" ] || exit 0
source native/compiler_cache.sh
generated=artifacts/native/fuzz
rm -rf "$generated" && mkdir -p "$generated"
trap 'rm -rf "$generated"' EXIT
protoc -Inative/proto --cpp_out="$generated" "${protos[@]}"
sanitize=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
# The debug information names the sources relative to the root, as ccache may hand it to another clone.
flags=(-std=c++17 -O1 -g -fdebug-prefix-map="$PWD"=. -Wall -Wextra -Werror -I"$generated" -Inative
  $(pkg-config --cflags protobuf))
# protoc's code is not ours to make -Wextra-clean: only its own warnings are switched off, and only for it; it is
# built with the sanitizers but without the fuzzer's coverage, which would only explore protobuf's generated code,
# and without optimisation: its 32,000 lines took 70 s of CPU at -O1, 16 s at -O0.
compiles=()
for proto in grpc_service model_config; do
  ccache clang++ "${flags[@]}" -O0 -Wno-unused-parameter -fsanitize=address,undefined -c "$generated/$proto.pb.cc" \
    -o "$generated/$proto.pb.o" &
  compiles+=($!)
done
ccache clang++ "${flags[@]}" "${sanitize[@]}" -c native/fuzz/infer_request_fuzz.cc -o "$generated/fuzz.o" &
compiles+=($!)
wait_for_each "${compiles[@]}"
mkdir -p "$(dirname "$out")"
clang++ "${sanitize[@]}" "$generated/fuzz.o" "$generated/grpc_service.pb.o" "$generated/model_config.pb.o" \
  -o "$out.tmp" $(pkg-config --libs protobuf) -pthread
mv "$out.tmp" "$out"
echo "built $out"
