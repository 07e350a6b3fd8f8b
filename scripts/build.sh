#!/usr/bin/env bash
# Configures and builds compcoll (Release) into ${BUILD_DIR:-build}.
# CMake's whole configure output goes to $BUILD_DIR/configure.log; what
# compcoll itself decided there (the GPU path: built or not, and why) is
# printed, and so is the log's end when configuring fails.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
mkdir -p "$BUILD_DIR"
log=$BUILD_DIR/configure.log
if ! cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > "$log" 2>&1; then
  echo "build.sh: configuring failed (whole log: $log):" >&2
  tail -n 30 "$log" >&2
  if grep -q "Does not match the generator used previously" "$log"; then
    echo "build.sh: $BUILD_DIR was configured with another generator; remove it (rm -rf $BUILD_DIR) and run this again" >&2
  fi
  exit 1
fi
grep -E "^-- compcoll" "$log" | sed 's/^-- /build.sh: /' || true
ninja -C "$BUILD_DIR" -j "$(nproc)"
