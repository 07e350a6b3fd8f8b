#!/usr/bin/env bash
# Builds the compcoll Python package (the torch.distributed backend) as a
# wheel and installs that wheel into the project's virtual environment:
# what a user gets from `pip install --no-build-isolation ./`, by way of a
# wheel file, so that the wheel itself is what the tests exercise.
#
#   scripts/install-python-package.sh          (after scripts/install-deps.sh)
#
# The wheel goes to build-wheel/. Compiling the extension takes minutes on
# two cores: one line per compiled file shows where it is (if the build
# fails, its compiler errors are printed; the whole log stays in build-wheel/). Build files stay in
# build-python/, so a second run recompiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
compcoll_use_venv

WHEEL_DIR=$COMPCOLL_ROOT/build-wheel
rm -rf "$WHEEL_DIR"
mkdir -p "$WHEEL_DIR"
log=$WHEEL_DIR/build.log
echo "install-python-package: building the wheel with $("$PY" --version) (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
t0=$(date +%s)
# --no-build-isolation: compile against the torch installed here (pip would
# otherwise fetch another torch into an isolated build environment);
# --no-deps: torch is already there. ninja's "[i/n] c++ ... -c SOURCE" lines
# are shortened to "[i/n] SOURCE".
if ! "$PY" -m pip wheel -v --no-build-isolation --no-deps --disable-pip-version-check \
       -w "$WHEEL_DIR" . > >(tee "$log" | awk '
         /^ *\[[0-9]+\/[0-9]+\]/ {
           src = ""
           for (i = 1; i <= NF; i++) if ($i == "-c") { src = $(i + 1) }
           if (src == "") { for (i = 1; i <= NF; i++) if ($i ~ /\.(cc|cpp|so)$/) src = $i }
           n = split(src, parts, "/")
           printf "  %s %s\n", $1, (n >= 2 ? parts[n - 1] "/" parts[n] : src); fflush() }') 2>&1; then
  # The compiler's errors first (pip's traceback after them says only that
  # the build failed), then the end of the log.
  echo "install-python-package: the wheel build FAILED; compiler errors (whole log: $log):" >&2
  grep -E -A4 "(error|fatal error):" "$log" | head -n 80 >&2 || true
  echo "install-python-package: end of the log:" >&2
  tail -n 8 "$log" >&2
  exit 1
fi
wheels=("$WHEEL_DIR"/compcoll-*.whl)
[ -f "${wheels[0]}" ] || { echo "install-python-package: no wheel in $WHEEL_DIR" >&2; exit 1; }
echo "install-python-package: built $(basename "${wheels[0]}") in $(( $(date +%s) - t0 )) s"
"$PY" -m pip install --root-user-action=ignore --disable-pip-version-check --no-deps \
  --force-reinstall "${wheels[0]}"
# The venv's compcoll must be the one imported (not a copy in the base
# interpreter's site-packages); run from / so the source tree is not on sys.path.
(cd / && "$PY" -c '
import os, sys, compcoll._C
path = os.path.realpath(compcoll._C.__file__)
if not path.startswith(os.path.realpath(sys.prefix)):
    sys.exit(f"install-python-package: compcoll imports from {path}, outside the venv {sys.prefix}")
from importlib.metadata import version
print("install-python-package: compcoll", version("compcoll"), "at", os.path.dirname(path))
')
