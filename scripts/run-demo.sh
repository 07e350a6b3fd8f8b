#!/usr/bin/env bash
# README's main command: installs what is missing, builds, and prints the
# benchmark tables: every codec on one thread against memcpy, then dense vs
# every algorithm across 4 local ranks on a ResNet-50-sized gradient.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BENCH=${BUILD_DIR:-build}/integration/bench/compcoll-bench
"$BENCH" codec --count 25557032
"$BENCH" codec --count 25557032 --algo dgc --momentum 0.9
