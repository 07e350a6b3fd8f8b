#!/usr/bin/env bash
# Installs what compcoll needs, and only what is missing: quick when
# everything is already there. Idempotent.
#
# 1. Debian packages (apt-get), one line per package while they install.
# 2. The project's Python virtual environment, .venv (scripts/python-env.sh
#    says why), made with the first python3 on PATH (COMPCOLL_PYTHON
#    overrides it), with --system-site-packages so that packages the
#    interpreter already has (pyenv's torch, say) are used, not fetched
#    again. Debian's own python3 has no torch: there pip installs it into
#    the venv (about 3 GB; minutes).
# 3. The Python packages the demo and the tests use, into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi

packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libgtest-dev libgmock-dev                     # unit and multi-rank tests
  libgloo-dev libhiredis-dev                    # Gloo transport, RedisStore
  redis-server                                  # a real store for rendezvous tests
  iproute2                                      # namespaces and tbf for --link
  clang-14 libclang-rt-14-dev                   # libFuzzer targets (scripts/run-fuzz.sh)
  python3 python3-venv                          # Debian's python and its venv module
)

# apt-get's own output is a screen of text per package; one line each says
# what is happening without hiding it (errors go to stderr, unfiltered).
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: apt-get update"
  $SUDO apt-get update -q | awk '/^(Err|W:|E:)/ { print "  " $0; fflush() }'
  echo "install-deps: apt-get install $*"
  $SUDO apt-get install -y -q --no-install-recommends -o Dpkg::Progress-Fancy=0 "$@" |
    awk '/^Get:/ { printf "  downloading %s %s\n", $5, $7; fflush() }
         /^Setting up / { print "  " $0; fflush() }
         /^(E:|W:)/ { print "  " $0; fflush() }'
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi

# The interpreter the venv is made from.
base=${COMPCOLL_PYTHON:-$(command -v python3 || true)}
if [ -z "$base" ]; then
  echo "install-deps: no python3 on PATH (set COMPCOLL_PYTHON to an interpreter)" >&2
  exit 1
fi

if ! compcoll_venv_ok; then
  if [ -e "$COMPCOLL_VENV" ]; then
    echo "install-deps: $COMPCOLL_VENV does not work (its interpreter is gone?): making it again"
  fi
  # Debian splits venv's pip bootstrap (ensurepip) into python3-venv (or
  # python3.X-venv for another Debian interpreter).
  if ! "$base" -c 'import ensurepip, venv' 2>/dev/null; then
    ver=$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    case "$("$base" -c 'import sys; print(sys.base_prefix)')" in
      /usr) apt_install "python$ver-venv" ;;
      *) echo "install-deps: $base has no ensurepip/venv module: cannot make a virtual environment" >&2
         exit 1 ;;
    esac
  fi
  echo "install-deps: making the virtual environment $COMPCOLL_VENV with $base ($("$base" --version))"
  "$base" -m venv --clear --system-site-packages "$COMPCOLL_VENV"
fi
compcoll_use_venv

# Python packages: matplotlib for the benchmark's --plot; torch,
# scikit-learn (the digits data) and pytest for the PyTorch backend and its
# tests. Looked up in the venv (which sees the base interpreter's packages
# too).
# find_spec, not import: importing torch takes seconds, and this runs every time.
read -r -a missing_py < <("$PY" - <<'PY'
import importlib.util
print(" ".join(m for m in ("matplotlib", "torch", "sklearn", "pytest")
               if importlib.util.find_spec(m) is None))
PY
)
# Building the package's wheel (scripts/install-python-package.sh) needs
# bdist_wheel: part of setuptools from 70.1 on, of the wheel package before.
"$PY" - <<'PY' 2>/dev/null || missing_py+=(wheel)
import importlib.util, sys, setuptools
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
sys.exit(0 if v >= (70, 1) or importlib.util.find_spec("wheel") else 1)
PY
if [ ${#missing_py[@]} -gt 0 ]; then
  pip_names=("${missing_py[@]/#sklearn/scikit-learn}")  # import name -> PyPI name
  note=
  case " ${pip_names[*]} " in *" torch "*) note=" (torch is about 3 GB: minutes)" ;; esac
  echo "install-deps: pip install ${pip_names[*]} into $COMPCOLL_VENV$note"
  # Disk: torch with its CUDA libraries is about 3 GB of wheels that unpack
  # to about 6 GB, so an install needs about 10 GB free at its peak. pip's
  # wheel cache would keep a second copy of the 3 GB for nothing (the venv
  # is made once), and its temporary files go beside the venv rather than
  # to /tmp, which may be a small tmpfs: one filesystem to check and to
  # name when it fills.
  pip_tmp="$COMPCOLL_VENV/.pip-tmp"
  mkdir -p "$pip_tmp"
  free_gb_at() { df -Pk "$1" | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
  free_gb=$(free_gb_at "$pip_tmp")
  need_gb=1
  case " ${pip_names[*]} " in *" torch "*) need_gb=10 ;; esac
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "install-deps: warning: $free_gb GB free under $COMPCOLL_VENV, and this install needs about $need_gb GB" >&2
  fi
  # pip's lines (Collecting, Downloading, Installing) are the progress; the
  # bar itself is drawn only on a terminal.
  if ! TMPDIR="$pip_tmp" "$PY" -m pip install --no-cache-dir --root-user-action=ignore \
      --disable-pip-version-check "${pip_names[@]}"; then
    free_gb=$(free_gb_at "$pip_tmp")
    rm -rf "$pip_tmp"
    echo "install-deps: pip install ${pip_names[*]} failed; $free_gb GB is free under $COMPCOLL_VENV" \
         "and torch needs about 10 GB there while it installs (COMPCOLL_VENV puts the venv elsewhere," \
         "COMPCOLL_PYTHON picks an interpreter that already has torch)" >&2
    exit 1
  fi
  rm -rf "$pip_tmp"
fi

# torchrun for the venv: pip writes it when it installs torch into the
# venv, but a torch seen through --system-site-packages brings only the base
# interpreter's torchrun, which runs the base interpreter (without the venv's
# packages, compcoll among them). Same entry point as torch's own script.
if [ ! -x "$COMPCOLL_VENV/bin/torchrun" ]; then
  cat > "$COMPCOLL_VENV/bin/torchrun" <<EOF
#!$PY
# Written by compcoll's scripts/install-deps.sh: torch's torchrun, run by this venv's python.
import sys
from torch.distributed.run import main
sys.exit(main())
EOF
  chmod +x "$COMPCOLL_VENV/bin/torchrun"
fi
