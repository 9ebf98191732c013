#!/usr/bin/env bash
# JAX's own jit tests, run with plain jax.jit and with jax.jit routed to nbjit.jit.
#
#   scripts/jax_tests.sh [jax|nbjit|both] [OUTDIR]
#
# Runs tests/api_test.py, tests/pjit_test.py and tests/jax_jit_test.py of a jax
# source tree, each file in its own pytest process (8 host CPU devices, -q, no
# xdist), once per mode. In `nbjit` mode a conftest.py calls nbjit.patch_jax()
# before the test modules import, so `from jax import jit` and `jax.jit` both
# give nbjit.jit. Writes OUTDIR/<mode>/<file>.xml (JUnit) and .log, then prints
# passed/failed/skipped per file and mode, and the tests that pass under jax.jit
# but not under nbjit. Not part of CI: a full run takes tens of minutes on 2 cores.
#
# Environment:
#   PYTHON        interpreter with jax, pytest and absl-py (default: .venv/bin/python
#                 of the main checkout, else python3)
#   JAX_SRC_GIT   a jax git directory (default: /work/.mirror/jax-ml+jax/repo);
#   JAX_SRC_REF   the commit or tag to take the tests from (default: jax-v<installed
#                 version> if that tag exists, else HEAD)
#   JAX_TESTS_DIR a directory holding the three test files instead of git
#   FILE_TIMEOUT  seconds per test file and mode (default 2400)
#   JAX_TESTS_CONFIG  jax (default): JAX's own pytest configuration, its pyproject.toml
#                 at the same ref (warnings are errors); default: warnings only shown
#   ONLY          space-separated subset of the files (e.g. "api_test.py")
set -euo pipefail

MODE=${1:-both}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${2:-$ROOT/jax_tests_out}
PYTHON=${PYTHON:-}
if [[ -z $PYTHON ]]; then
  if [[ -x /work/main/.venv/bin/python ]]; then PYTHON=/work/main/.venv/bin/python; else PYTHON=python3; fi
fi
FILES=${ONLY:-"api_test.py pjit_test.py jax_jit_test.py"}
FILE_TIMEOUT=${FILE_TIMEOUT:-2400}

"$PYTHON" -c "import absl" 2>/dev/null || {
  echo "JAX's tests need absl-py: $PYTHON -m pip install absl-py" >&2; exit 2; }

SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
if [[ -n ${JAX_TESTS_DIR:-} ]]; then
  for f in $FILES; do cp "$JAX_TESTS_DIR/$f" "$SRC/"; done
  REF="dir $JAX_TESTS_DIR"
else
  GIT=${JAX_SRC_GIT:-/work/.mirror/jax-ml+jax/repo}
  VERSION=$("$PYTHON" -c "import jax; print(jax.__version__)")
  REF=${JAX_SRC_REF:-}
  if [[ -z $REF ]]; then
    if git --git-dir="$GIT" rev-parse -q --verify "refs/tags/jax-v$VERSION" >/dev/null; then
      REF="jax-v$VERSION"
    else
      REF=HEAD
      echo "note: no tag jax-v$VERSION in $GIT; taking the tests from HEAD" \
        "($(git --git-dir="$GIT" log -1 --format='%h %cs' HEAD)) against installed jax $VERSION" >&2
    fi
  fi
  for f in $FILES; do git --git-dir="$GIT" show "$REF:tests/$f" >"$SRC/$f"; done
fi

# Patches before any test module imports jax.jit (conftest.py loads first).
cat >"$SRC/conftest.py" <<'PY'
import importlib
import os

# Names the test files import that the installed jax lacks (the tests come from
# a jax tree that is not exactly the installed release): stubs that raise when
# used, so only the tests using them fail, alike in both modes.
_MISSING = {"jax._src.ad_checkpoint": ["custom_remat", "SaveOnlyTheseNames"]}
for _mod, _names in _MISSING.items():
    _m = importlib.import_module(_mod)
    for _n in _names:
        if not hasattr(_m, _n):
            def _stub(*a, _n=_n, **k):
                raise NotImplementedError(f"{_n}: not in the installed jax")
            setattr(_m, _n, _stub)

if os.environ.get("NBJIT_JAX_TESTS_MODE") == "nbjit":
    import nbjit
    nbjit.patch_jax()
    import jax
    assert jax.jit is nbjit.jit
PY
# JAX's own pytest configuration (its pyproject.toml at the same ref: warnings are
# errors, but for those it lists), as JAX's CI runs these files: a warning nbjit
# raised would fail them. JAX_TESTS_CONFIG=default shows warnings instead.
JAX_PYPROJECT=
if [[ ${JAX_TESTS_CONFIG:-jax} == jax ]]; then
  if [[ -n ${JAX_TESTS_DIR:-} ]]; then
    [[ -f $JAX_TESTS_DIR/../pyproject.toml ]] && JAX_PYPROJECT=$(cat "$JAX_TESTS_DIR/../pyproject.toml")
  else
    JAX_PYPROJECT=$(git --git-dir="$GIT" show "$REF:pyproject.toml" 2>/dev/null || true)
  fi
fi
JAX_PYPROJECT=$JAX_PYPROJECT "$PYTHON" - "$SRC/pytest.ini" <<'PY'
import os, sys, tomllib
options = tomllib.loads(os.environ["JAX_PYPROJECT"] or "").get("tool", {}).get(
    "pytest", {}).get("ini_options", {})
lines = ["[pytest]", "filterwarnings ="]
lines += [f"    {w}" for w in options.get("filterwarnings", ["default"])]
if options.get("markers"):
    lines += ["markers ="] + [f"    {m}" for m in options["markers"]]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("pytest configuration: " + ("JAX's own (pyproject.toml: filterwarnings "
      + ", ".join(options["filterwarnings"][:1]) + ", ...)" if options.get("filterwarnings")
      else "warnings shown, not errors"), file=sys.stderr)
PY

run_mode() {
  local mode=$1
  mkdir -p "$OUT/$mode"
  for f in $FILES; do
    local name=${f%.py}
    echo "== $mode $f (timeout ${FILE_TIMEOUT}s)" >&2
    (cd "$SRC" && NBJIT_JAX_TESTS_MODE=$mode PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
      XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=8" \
      timeout -k 30 "$FILE_TIMEOUT" "$PYTHON" -m pytest "$f" -q -p no:cacheprovider \
        -o addopts= --junitxml="$OUT/$mode/$name.xml" >"$OUT/$mode/$name.log" 2>&1) || true
    tail -n 1 "$OUT/$mode/$name.log" >&2
  done
}

case $MODE in
  jax) run_mode jax ;;
  nbjit) run_mode nbjit ;;
  both) run_mode jax; run_mode nbjit ;;
  summary) ;;
  *) echo "usage: $0 [jax|nbjit|both|summary] [OUTDIR]" >&2; exit 2 ;;
esac
echo "tests from: $REF" >&2
"$PYTHON" "$ROOT/scripts/jax_tests_summary.py" "$OUT"
