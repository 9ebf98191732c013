#!/usr/bin/env bash
# A real library's test suite, run with plain JAX and with nbjit routed in.
#
#   scripts/library_tests.sh LIBRARY [MODE] [OUTDIR]
#
# LIBRARY is optax or equinox, at the version installed in PYTHON's environment
# (install it and its test dependencies first:
#   optax:   $PYTHON -m pip install optax flax scikit-learn
#   equinox: $PYTHON -m pip install 'nbjit[equinox]' beartype optax).
# MODE (default both):
#   jax      the library's suite as it is (the reference)
#   nbjit    jax.jit routed to nbjit.jit (a conftest.py above the tests calls
#            nbjit.patch_jax(filter_jit=False) before they import anything)
#   filter   equinox only: equinox.filter_jit = nbjit.filter_jit (rebound at the
#            session start, as a user would; equinox's internal uses stay its own)
#   both     jax, then nbjit          conformance  jax, then filter (equinox)
#   all      jax, nbjit, filter       summary      only read OUTDIR
# equinox's wall-clock `test_speed_*` tests are deselected in every mode.
#
# Where the tests come from (the installed version's), first that applies:
#   LIBRARY_SRC=DIR    a directory holding the library's test tree (a source
#                      checkout or unpacked archive), or a git directory (tag v<version>)
#   third_party/       equinox: the vendored copy of its suite when its version is the
#                      installed one (third_party/equinox-<version>/tests)
#   the package index  `pip download --no-binary :all:` of the sdist, if it carries tests
#                      (optax's does; equinox's does not)
# The suite runs in one pytest process per mode (-q, no xdist), under the library's own
# pytest configuration where the source has it (its pyproject.toml at the tag, or beside the
# vendored copy: equinox's turns warnings into errors), its addopts dropped. Writes OUTDIR/<mode>/<library>.xml (JUnit) and .log, then prints
# passed/failed/skipped per mode and every test that passes in the reference (jax) mode and
# not in the other (scripts/jax_tests_summary.py). With STRICT=1 the exit status is 1 when
# any does (CI). Environment: PYTHON (default .venv/bin/python of this checkout, else
# python3), SUITE_TIMEOUT (seconds per mode, default 3600), LIBRARY_TEST_PATHS (test files
# or directories relative to the test tree's root, default the whole suite).
set -euo pipefail

usage="usage: $0 optax|equinox [jax|nbjit|filter|both|conformance|all|summary] [OUTDIR]"
LIB=${1:?$usage}
MODE=${2:-both}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${3:-$ROOT/library_tests_out/$LIB}
case $OUT in  # the suite runs from its own tree: a relative OUTDIR names a folder from here
  /*) ;;
  *) OUT=$PWD/$OUT ;;
esac
PYTHON=${PYTHON:-}
if [[ -z $PYTHON ]]; then
  if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
case $PYTHON in  # a relative path names a file from here, not from the test tree
  /*) ;;
  */*) PYTHON=$PWD/$PYTHON ;;
esac
SUITE_TIMEOUT=${SUITE_TIMEOUT:-3600}
case $MODE in  # the modes to run, in order (summary: none, only read OUTDIR)
  jax | nbjit | filter) MODES=$MODE ;;
  both) MODES="jax nbjit" ;;
  conformance) MODES="jax filter" ;;
  all) MODES="jax nbjit filter" ;;
  summary) MODES="" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
if [[ $LIB != equinox && $MODES == *filter* ]]; then
  echo "mode $MODE: filter_jit is equinox's; use it with equinox" >&2; exit 2
fi

summarise() {  # the reference (jax) against each other mode run; STRICT=1: fail on a loss
  local status=0 other
  for other in nbjit filter; do
    [[ -d $OUT/$other ]] || continue
    local view
    view=$(mktemp -d)
    [[ -d $OUT/jax ]] && ln -s "$OUT/jax" "$view/jax"
    ln -s "$OUT/$other" "$view/nbjit"
    echo "== $LIB: jax (reference) against $other (shown as 'nbjit')"
    "$PYTHON" "$ROOT/scripts/jax_tests_summary.py" "$view" | tee "$view/summary.txt"
    if grep -Eq ": [1-9][0-9]* pass under jax.jit and not" "$view/summary.txt"; then status=1; fi
    rm -rf "$view"
  done
  if [[ ${STRICT:-0} == 1 ]]; then return $status; fi
}
if [[ -z $MODES ]]; then summarise; exit; fi

VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('$LIB'))" 2>/dev/null) || {
  echo "$LIB is not installed for $PYTHON (see the header of $0)" >&2; exit 2; }

SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
TESTS_IN=(tests)  # where the suite lies inside its tree
[[ $LIB == optax ]] && TESTS_IN=(optax)

from_git() {  # $1: a git directory; unpacks tag v$VERSION's test tree into $SRC/tree
  mkdir -p "$SRC/tree"
  # a partial mirror may lack blobs outside the tests (git archive complains): check the tree
  { git --git-dir="$1" archive "v$VERSION" "${TESTS_IN[@]}" 2>/dev/null || true; } \
    | tar x -C "$SRC/tree"
  # Its own pytest configuration (warnings as errors, ...), as its CI runs the suite.
  git --git-dir="$1" show "v$VERSION:pyproject.toml" >"$SRC/tree/pyproject.toml" 2>/dev/null \
    || rm -f "$SRC/tree/pyproject.toml"
  find "$SRC/tree/${TESTS_IN[0]}" -name 'test_*.py' | grep -q . || {
    echo "no tests at v$VERSION in $1" >&2; exit 2; }
  TREE=$SRC/tree/
}

from_sdist() {  # the sdist on the package index, if its tree carries the tests
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$SRC/dist" "$LIB==$VERSION" \
    >/dev/null 2>&1 || return 1
  tar xzf "$SRC"/dist/*.tar.gz -C "$SRC"
  local tree
  tree=$(echo "$SRC"/"$LIB"-*/)
  [[ -d $tree/${TESTS_IN[0]} ]] && find "$tree/${TESTS_IN[0]}" -name 'test_*.py' | grep -q . \
    || return 1
  TREE=$tree
}

TREE=
if [[ -n ${LIBRARY_SRC:-} ]]; then
  if git --git-dir="$LIBRARY_SRC" rev-parse -q --verify "v$VERSION^{commit}" >/dev/null 2>&1; then
    from_git "$LIBRARY_SRC"
  elif [[ -d $LIBRARY_SRC/.git ]] && git -C "$LIBRARY_SRC" rev-parse -q --verify "v$VERSION^{commit}" >/dev/null 2>&1; then
    from_git "$LIBRARY_SRC/.git"
  else
    mkdir -p "$SRC/tree"
    cp -r "$LIBRARY_SRC/${TESTS_IN[0]}" "$SRC/tree/"
    TREE=$SRC/tree/
  fi
elif [[ -d $ROOT/third_party/$LIB-$VERSION/${TESTS_IN[0]} ]]; then
  mkdir -p "$SRC/tree"
  cp -r "$ROOT/third_party/$LIB-$VERSION/${TESTS_IN[0]}" "$SRC/tree/"
  [[ -f $ROOT/third_party/$LIB-$VERSION/pyproject.toml ]] \
    && cp "$ROOT/third_party/$LIB-$VERSION/pyproject.toml" "$SRC/tree/"
  TREE=$SRC/tree/
  LIBRARY_SRC=$ROOT/third_party/$LIB-$VERSION
elif from_sdist; then
  :
else
  echo "no tests for $LIB $VERSION: give LIBRARY_SRC=DIR, a checkout of its tag v$VERSION" \
       "(see the header of $0)" >&2; exit 2
fi
SOURCE=${LIBRARY_SRC:-"the package index (its sdist)"}
echo "$LIB $VERSION tests from $SOURCE" >&2

# Loaded before the library's own conftest.py files and test modules.
cat >"$TREE/conftest.py" <<'PY'
import collections
import os

MODE = os.environ.get("NBJIT_LIBRARY_TESTS_MODE")

if MODE == "nbjit":
    import nbjit
    nbjit.patch_jax(filter_jit=False)
    import jax
    assert jax.jit is nbjit.jit

if MODE == "filter":
    def pytest_sessionstart(session):
        # At the session start, not at import: equinox's pytest options have
        # jaxtyping instrument equinox when it is first imported.
        import equinox

        import nbjit
        equinox.filter_jit = nbjit.filter_jit

if MODE in ("nbjit", "filter"):
    def pytest_terminal_summary(terminalreporter):
        # The nbjit functions still alive at the end (module-level ones, mostly):
        # shows that the suite's calls went through nbjit, and how.
        import nbjit
        table = nbjit.stats()
        total, reasons = collections.Counter(), collections.Counter()
        for s in table.values():
            total.update(calls=s.calls, hits=s.hits, misses=s.misses, slow=s.slow,
                         traced=getattr(s, "traced", 0), raised=getattr(s, "raised", 0))
            reasons.update(s.slow_reasons)
        terminalreporter.write_line(
            f"nbjit ({MODE}): {len(table)} live jitted functions; calls {total['calls']}, "
            f"hits {total['hits']}, misses {total['misses']}, traced {total['traced']}, "
            f"raised {total['raised']}, slow {total['slow']} {dict(reasons)}")
PY

read -r -a PATHS <<<"${LIBRARY_TEST_PATHS:-${TESTS_IN[*]}}"
SELECT=()
[[ $LIB == equinox ]] && SELECT=(-k "not test_speed")

run_mode() {
  local mode=$1
  mkdir -p "$OUT/$mode"
  echo "== $mode $LIB $VERSION (timeout ${SUITE_TIMEOUT}s)" >&2
  (cd "$TREE" && NBJIT_LIBRARY_TESTS_MODE=$mode PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    timeout -k 30 "$SUITE_TIMEOUT" "$PYTHON" -m pytest "${PATHS[@]}" ${SELECT[@]+"${SELECT[@]}"} \
      -q -p no:cacheprovider -o addopts= --junitxml="$OUT/$mode/$LIB.xml" \
      >"$OUT/$mode/$LIB.log" 2>&1) || true
  tail -n 1 "$OUT/$mode/$LIB.log" >&2
  # A mode that ran no test (a broken interpreter, no tree) compares nothing: say so, and
  # with STRICT=1 fail rather than pass vacuously.
  if ! grep -Eq "[0-9]+ passed" "$OUT/$mode/$LIB.log"; then
    echo "$LIB: no test passed in mode $mode (see $OUT/$mode/$LIB.log)" >&2
    [[ ${STRICT:-0} == 1 ]] && exit 1
  fi
  return 0
}

for mode in $MODES; do run_mode "$mode"; done
summarise
