#!/usr/bin/env bash
# Creates (or reuses) a Python 3.12 virtual environment with nbjit installed.
#   bash scripts/bootstrap.sh [VENV_DIR] [EXTRA PIP REQUIREMENTS...]
# VENV_DIR defaults to .venv; extras, e.g. "jax==0.11.2" "jaxlib==0.11.2",
# are installed on top (used by CI to test the oldest supported jax).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
shift || true

works() {  # a pyenv shim can exist and still fail, so run each candidate
  "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1
}

find_python() {
  local candidate
  for candidate in "$(command -v python3.12 || true)" \
                   "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3 \
                   "$HOME"/.pyenv/versions/3.12*/bin/python3; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && works "$candidate"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x "$venv/bin/python" ]; then
  python=$(find_python) || {
    echo "error: nbjit needs Python 3.12 (jax 0.11+ has no wheels for 3.11)." >&2
    echo "       Install python3.12 on the PATH, or via pyenv: pyenv install 3.12" >&2
    exit 1
  }
  echo "bootstrap: creating $venv with $python" >&2
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[test,bench]" "$@"
"$venv/bin/python" -c "import jax, numba, nbjit; print('bootstrap: jax', jax.__version__, 'numba', numba.__version__, 'nbjit', nbjit.__version__)" >&2
