#!/usr/bin/env bash
# Builds the libFuzzer target of the gRPC front's request checks, `native/fuzz/build.sh OUT`: clang with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (Debian 12's clang 14 links -fsanitize=fuzzer with the
# libclang-rt-14-dev it brings), against the message classes protoc makes from native/proto and Debian's protobuf.
# Rebuilt only when a source is newer. clang, protobuf-compiler and libprotobuf-dev installed through
# tools/debian_packages.sh where missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: native/fuzz/build.sh OUT}
missing=()
command -v clang++ >/dev/null || missing+=(clang)
command -v pkg-config >/dev/null || missing+=(pkg-config)
for package in protobuf-compiler libprotobuf-dev; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] || tools/debian_packages.sh install "${missing[@]}"
protos=(native/proto/grpc_service.proto native/proto/model_config.proto)
sources=(native/fuzz/infer_request_fuzz.cc native/infer_request_check.h native/fuzz/build.sh "${protos[@]}")
stale=
[ -f "$out" ] || stale=missing
for source in "${sources[@]}"; do [ "$source" -nt "$out" ] && stale=newer; done
[ -n "$stale" ] || exit 0
generated=$(mktemp -d)
trap 'rm -rf "$generated"' EXIT
protoc -Inative/proto --cpp_out="$generated" "${protos[@]}"
sanitize=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
flags=(-std=c++17 -O1 -g -Wall -Wextra -Werror -I"$generated" -Inative $(pkg-config --cflags protobuf))
# protoc's code is not ours to make -Wextra-clean: only its own warnings are switched off, and only for it; it is
# built with the sanitizers but without the fuzzer's coverage, which would only explore protobuf's generated code.
for proto in grpc_service model_config; do
  clang++ "${flags[@]}" -Wno-unused-parameter -fsanitize=address,undefined -c "$generated/$proto.pb.cc" \
    -o "$generated/$proto.pb.o" &
done
wait
mkdir -p "$(dirname "$out")"
clang++ "${flags[@]}" "${sanitize[@]}" native/fuzz/infer_request_fuzz.cc "$generated/grpc_service.pb.o" \
  "$generated/model_config.pb.o" -o "$out.tmp" $(pkg-config --libs protobuf) -pthread
mv "$out.tmp" "$out"
echo "built $out"
