#!/usr/bin/env bash
# README's test commands (README, "The test command").
#
#   scripts/run-tests.sh            the full run, what CI runs (.ci/run)
#   scripts/run-tests.sh --quick    the everyday check: steps 1-3 only
#                                   (COMPCOLL_CI_QUICK=1 does the same)
#
# 1. Installs what is missing (scripts/install-deps.sh: Debian packages,
#    the project venv .venv and its Python packages).
# 2. The Release build and its whole ctest suite.
# 3. The PyTorch package built as a wheel, installed into the venv
#    (scripts/install-python-package.sh), and pytest tests/python.
# 4. The suite under ASan+UBSan and TSan, the PyTorch tests with a sanitized
#    extension (scripts/run-sanitizers.sh all).
# 5. Every fuzz target for a minute (scripts/run-fuzz.sh 60).
# Stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=${COMPCOLL_CI_QUICK:-0}
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run-tests: unknown argument '$arg' (only --quick)" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
step_start=$start
step() {  # ends the previous step with its duration, starts the next
  local now
  now=$(date +%s)
  [ -n "${current:-}" ] && echo "run-tests: $current done in $(( now - step_start )) s"
  current=$1
  step_start=$now
  echo "run-tests: === $current"
}

step "1. dependencies"
bash scripts/install-deps.sh
source scripts/python-env.sh
compcoll_use_venv  # python3 is the venv's from here on, for every step

step "2. Release build and ctest"
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 600 -j 2

step "3. PyTorch package (wheel) and pytest"
bash scripts/install-python-package.sh
python3 -m pytest -q tests/python

if [ "$quick" = 1 ]; then
  step "done (--quick: sanitizer and fuzz runs skipped)"
  echo "run-tests: quick run passed in $(( $(date +%s) - start )) s"
  exit 0
fi

step "4. sanitizers"
bash scripts/run-sanitizers.sh all

step "5. fuzzers"
bash scripts/run-fuzz.sh 60

step "done"
echo "run-tests: full run passed in $(( $(date +%s) - start )) s"
