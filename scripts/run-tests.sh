#!/usr/bin/env bash
# README's test command: installs what is missing, builds, runs every test.
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
