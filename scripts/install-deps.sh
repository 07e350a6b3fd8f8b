#!/usr/bin/env bash
# Installs what compcoll needs from Debian's packages, and only what is
# missing: quiet (and quick) when everything is already there. Idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  libgtest-dev libgmock-dev                     # unit and multi-rank tests
  libgloo-dev libhiredis-dev                    # Gloo transport, RedisStore
  redis-server                                  # a real store for rendezvous tests
  iproute2                                      # namespaces and tbf for --link
  clang-14 libclang-rt-14-dev                   # libFuzzer targets (scripts/run-fuzz.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python packages (PyPI): matplotlib for the benchmark's --plot; torch,
# scikit-learn (the digits data) and pytest for the PyTorch backend and its
# tests. torch from PyPI is large (about 3 GB with its CUDA libraries; about
# 90 s to install here).
python_packages=(matplotlib torch sklearn pytest)
missing_py=()
for p in "${python_packages[@]}"; do
  python3 -c "import $p" 2>/dev/null || missing_py+=("$p")
done
if [ ${#missing_py[@]} -gt 0 ]; then
  # Import names to PyPI names.
  pip_names=("${missing_py[@]/#sklearn/scikit-learn}")
  echo "install-deps: pip installing ${pip_names[*]}"
  python3 -m pip install -q --root-user-action=ignore "${pip_names[@]}"
fi
