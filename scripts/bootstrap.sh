#!/usr/bin/env bash
# Creates (or reuses) a Python 3.11, 3.12 or 3.13 virtual environment with nbjit installed,
# with its test, bench and equinox extras (so every test and every compare row runs:
# nbjit.filter_jit's need equinox).
#   bash scripts/bootstrap.sh [VENV_DIR] [EXTRA PIP REQUIREMENTS...]
# VENV_DIR defaults to .venv; extras, e.g. "jax==0.10.2" "jaxlib==0.10.2",
# are installed on top (used by CI to test older supported jax).
# Reinstalls only when pyproject.toml, the extras or the interpreter changed.
# NBJIT_PYTHON picks the interpreter: a version (3.12, the default, 3.11 or 3.13),
# found as python3.X on the PATH, then under pyenv; or a path to a python.
# Python 3.11 gets jax <= 0.10.2 (jaxlib's last wheels for 3.11): the TPU
# machines' stack, CI's lowest leg.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
shift || true
choice=${NBJIT_PYTHON:-3.12}
supported="3.11 3.12 3.13"  # keep in step with pyproject.toml's classifiers

version_of() {  # "3.12" for a working interpreter, nothing for a broken one or a stale shim
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

find_python() {  # find_python 3.12: the first working interpreter of that version
  local want=$1 candidate root
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  for candidate in "$(command -v "python$want" || true)" \
                   "$root"/versions/"$want"*/bin/python3 \
                   "$HOME"/.pyenv/versions/"$want"*/bin/python3; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && [ "$(version_of "$candidate")" = "$want" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if [ ! -x "$venv/bin/python" ]; then
  case "$choice" in
    */*)  # a path: use it if its version is supported
      python=$choice
      have=$(version_of "$python")
      if [ -z "$have" ] || [[ " $supported " != *" $have "* ]]; then
        echo "error: NBJIT_PYTHON=$choice is Python ${have:-?}; nbjit supports $supported." >&2
        exit 1
      fi ;;
    *)
      if [[ " $supported " != *" $choice "* ]]; then
        echo "error: NBJIT_PYTHON=$choice: nbjit supports Python $supported" \
             "(older ones have no jax 0.10.2 wheels; newer ones are untested)." >&2
        exit 1
      fi
      python=$(find_python "$choice") || {
        echo "error: no Python $choice found (python$choice on the PATH, or" \
             "\$(pyenv root)/versions/$choice*/bin/python3)." >&2
        echo "       Install it (pyenv install $choice), or point NBJIT_PYTHON at a" \
             "python of version $supported." >&2
        exit 1
      } ;;
  esac
  echo "bootstrap: creating $venv with $python" >&2
  "$python" -m venv "$venv"
fi
# The install is skipped when nothing it installs from changed: a hash of
# pyproject.toml, the extra requirements, the interpreter and this checkout's
# path (the editable install points here), kept in the venv. nbjit itself is
# installed editable, so edits to its code need no reinstall.
stamp="$venv/.nbjit-bootstrap-hash"
want=$({ cat pyproject.toml; printf 'extra: %s\n' "$@"; pwd
         "$venv/bin/python" -c 'import sys; print(sys.executable, sys.version)'; } | sha256sum)
want=${want%% *}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "bootstrap: $venv is up to date (pyproject.toml, extras and Python unchanged); not reinstalling" >&2
else
  rm -f "$stamp"  # a failed install below leaves no stamp, so the next run retries
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e ".[test,bench,equinox]" "$@"
  echo "$want" > "$stamp"
fi
"$venv/bin/python" -c "import sys, jax, numba, equinox, nbjit; print('bootstrap: Python', sys.version.split()[0], 'jax', jax.__version__, 'numba', numba.__version__, 'equinox', equinox.__version__, 'nbjit', nbjit.__version__)" >&2
