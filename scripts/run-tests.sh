#!/usr/bin/env bash
# README's test command: installs what is missing, builds, runs every test:
# the Release ctest suite, the PyTorch tests, the sanitizer runs and the
# fuzzers (README, "The test command"). COMPCOLL_CI_QUICK=1 stops after the
# PyTorch tests (local use; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j 2

# The PyTorch backend: build the extension against the installed torch
# (--no-build-isolation: use that torch, do not fetch another) and run its tests.
python3 -m pip install -q --root-user-action=ignore --no-build-isolation ./
python3 -m pytest -q tests/python

if [ "${COMPCOLL_CI_QUICK:-0}" = 1 ]; then
  echo "run-tests: COMPCOLL_CI_QUICK=1: sanitizer and fuzz runs skipped"
  exit 0
fi

# The same suite under ASan+UBSan and TSan (and the PyTorch tests with a
# sanitized extension), then every fuzz target for a minute.
bash scripts/run-sanitizers.sh all
bash scripts/run-fuzz.sh 60
