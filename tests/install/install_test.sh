#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds two consumer
# programs against it (CMake find_package, and plain cc with pkg-config),
# and runs them as 2 ranks with dgc over a FileStore.
set -euo pipefail
build=$1
src=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
ninja -C "$tmp/consumer" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
cc "$src/consumer/main.c" -o "$tmp/consumer_pc" $(pkg-config --cflags --libs compcoll)
export LD_LIBRARY_PATH="$tmp/prefix/lib"
export COMPCOLL_ALGO=dgc COMPCOLL_DENSITY=0.01 COMPCOLL_TIMEOUT_MS=20000
run_pair() {  # binary, store dir
  "$1" "file://$2" 0 2 >"$tmp/r0.out" 2>&1 & p0=$!
  "$1" "file://$2" 1 2 >"$tmp/r1.out" 2>&1 & p1=$!
  wait $p0 || { cat "$tmp/r0.out"; exit 1; }
  wait $p1 || { cat "$tmp/r1.out"; exit 1; }
  cat "$tmp/r0.out" "$tmp/r1.out"
}
run_pair "$tmp/consumer/consumer_c" "$tmp/s1" | tee "$tmp/c.out"
grep -q "rank 0: calls 2 compressed 1" "$tmp/c.out"
run_pair "$tmp/consumer_pc" "$tmp/s2" >/dev/null
run_pair "$tmp/consumer/consumer_cpp" "$tmp/s3" | tee "$tmp/cpp.out"
grep -q "rank 1 of 2: ok, compressed calls 1" "$tmp/cpp.out"
"$tmp/prefix/bin/compcoll-info" >/dev/null
echo "install test: passed"
