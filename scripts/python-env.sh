# shellcheck shell=bash
# Sourced (not run) by the scripts: the project's Python virtual environment.
#
# Every script runs Python from one virtual environment, .venv at the
# repository root (COMPCOLL_VENV overrides the path), which
# scripts/install-deps.sh creates. Why a venv and not the interpreter on
# PATH: Debian's own python3 is "externally managed" (PEP 668) and refuses
# `pip install`; a venv is where pip may install on every interpreter, and
# it keeps the project's packages apart from everyone else's.
#
# After `compcoll_use_venv`, `python3`, `pip` and `torchrun` on PATH are the
# venv's, for these scripts and for every process they start (the
# benchmark's --plot runs `python3`, pytest starts ranks with
# sys.executable, torchrun's workers inherit it).

COMPCOLL_ROOT=${COMPCOLL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
COMPCOLL_VENV=${COMPCOLL_VENV:-$COMPCOLL_ROOT/.venv}
PY=$COMPCOLL_VENV/bin/python

# True when the venv exists and its interpreter runs (a venv whose base
# interpreter was removed or upgraded away is broken and must be remade).
compcoll_venv_ok() {
  [ -x "$PY" ] && "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)' 2>/dev/null
}

# Puts the venv first on PATH, as `source .venv/bin/activate` does.
compcoll_use_venv() {
  if ! compcoll_venv_ok; then
    echo "compcoll: no working virtual environment at $COMPCOLL_VENV;" \
         "run scripts/install-deps.sh first" >&2
    return 1
  fi
  export VIRTUAL_ENV=$COMPCOLL_VENV
  case ":$PATH:" in *":$COMPCOLL_VENV/bin:"*) ;; *) export PATH="$COMPCOLL_VENV/bin:$PATH" ;; esac
  # A PYTHONHOME meant for another interpreter would break the venv's.
  unset PYTHONHOME
}
