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

# Python packages (PyPI), for the benchmark's --plot.
python_packages=(matplotlib)
missing_py=()
for p in "${python_packages[@]}"; do
  python3 -c "import $p" 2>/dev/null || missing_py+=("$p")
done
if [ ${#missing_py[@]} -gt 0 ]; then
  echo "install-deps: pip installing ${missing_py[*]}"
  python3 -m pip install -q --root-user-action=ignore "${missing_py[@]}"
fi
