#!/usr/bin/env bash
# Builds the gRPC front of the embedded tritonserver (s2t_grpc_front, native/grpc_front.cc): `native/build_grpc_front.sh
# [OUT]`, by default s2t/serve/native/s2t_grpc_front, where `s2t serve` finds it, when a source or Debian's gRPC library
# is newer. Needs g++, pkg-config and Debian's gRPC (libgrpc++-dev, 1.51 on Debian 12), installed with apt where
# missing. gRPC and its dependencies are linked statically: the binary needs only the C and C++ runtimes, so the
# wheel's copy runs where no gRPC package is installed; an upgraded libgrpc++-dev makes the next build relink.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-s2t/serve/native/s2t_grpc_front}
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
dpkg -s libgrpc++-dev >/dev/null 2>&1 || missing+=(libgrpc++-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
sources=(native/grpc_front.cc native/build_grpc_front.sh "$(pkg-config --variable=libdir grpc)/libgrpc.a")
stale=$([ -f "$out" ] || echo missing)
for source in "${sources[@]}"; do [ "$source" -nt "$out" ] && stale=newer; done
[ -n "$stale" ] || exit 0
# pkg-config names libatomic inside --as-needed brackets and librt: both stay shared, as glibc's own are.
libs=$(pkg-config --static --libs grpc++ | sed 's/-Wl,--push-state,--as-needed -latomic -Wl,--pop-state//; s/ -lrt\b//g')
mkdir -p "$(dirname "$out")"
g++ -std=c++17 -O2 -Wall -Wextra -Werror $(pkg-config --cflags grpc++) native/grpc_front.cc -o "$out.tmp" \
  -Wl,-Bstatic $libs -Wl,-Bdynamic -latomic -lrt -pthread -s
mv "$out.tmp" "$out"
echo "built $out"
