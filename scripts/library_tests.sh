#!/usr/bin/env bash
# A real library's test suite, run with plain jax.jit and with jax.jit routed to nbjit.jit.
#
#   scripts/library_tests.sh LIBRARY [jax|nbjit|both|summary] [OUTDIR]
#
# LIBRARY is optax or equinox, at the version installed in PYTHON's environment
# (install it and its test dependencies first:
#   optax:   $PYTHON -m pip install optax flax scikit-learn
#   equinox: $PYTHON -m pip install equinox beartype optax).
# optax's tests come from its source distribution on the package index (`pip download`);
# equinox ships none there, so its tests come from a git directory (EQUINOX_SRC_GIT, tag
# v<installed version>). The whole suite runs in one pytest process per mode (-q, no
# xdist, the library's own pytest options dropped); in `nbjit` mode a conftest.py above
# the tests calls nbjit.patch_jax() before they import anything, so `jax.jit` and
# `from jax import jit` both give nbjit.jit. Writes OUTDIR/<mode>/<library>.xml (JUnit)
# and .log, then prints passed/failed/skipped per mode and every test that passes under
# jax.jit and not under nbjit (scripts/jax_tests_summary.py). Not part of CI: optax's
# suite takes ~17 min per mode on 2 cores.
#
# Environment:
#   PYTHON           interpreter with jax, pytest and the library (default: .venv/bin/python
#                    of this checkout, else python3)
#   EQUINOX_SRC_GIT  an equinox git directory (default: /work/.mirror/patrick-kidger+equinox/repo)
#   SUITE_TIMEOUT    seconds per mode (default 3600)
set -euo pipefail

LIB=${1:?usage: $0 optax|equinox [jax|nbjit|both|summary] [OUTDIR]}
MODE=${2:-both}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${3:-$ROOT/library_tests_out/$LIB}
PYTHON=${PYTHON:-}
if [[ -z $PYTHON ]]; then
  if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
SUITE_TIMEOUT=${SUITE_TIMEOUT:-3600}
case $MODE in  # the modes to run, in order (summary: none, only read OUTDIR)
  jax | nbjit) MODES=$MODE ;;
  both) MODES="jax nbjit" ;;
  summary) MODES="" ;;
  *) echo "usage: $0 optax|equinox [jax|nbjit|both|summary] [OUTDIR]" >&2; exit 2 ;;
esac
if [[ -z $MODES ]]; then exec "$PYTHON" "$ROOT/scripts/jax_tests_summary.py" "$OUT"; fi

VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('$LIB'))" 2>/dev/null) || {
  echo "$LIB is not installed for $PYTHON (see the header of $0)" >&2; exit 2; }

SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
case $LIB in
  optax)
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$SRC/dist" "optax==$VERSION"
    tar xzf "$SRC"/dist/optax-*.tar.gz -C "$SRC"
    TREE=$(echo "$SRC"/optax-*/)
    TESTS=optax ;;
  equinox)
    GIT=${EQUINOX_SRC_GIT:-/work/.mirror/patrick-kidger+equinox/repo}
    mkdir -p "$SRC/equinox"
    git --git-dir="$GIT" archive "v$VERSION" tests | tar x -C "$SRC/equinox"
    TREE=$SRC/equinox/
    TESTS=tests ;;
  *) echo "unknown library $LIB: optax or equinox" >&2; exit 2 ;;
esac

# Loaded before the library's own conftest.py files and test modules.
cat >"$TREE/conftest.py" <<'PY'
import os

if os.environ.get("NBJIT_LIBRARY_TESTS_MODE") == "nbjit":
    import collections

    import nbjit
    nbjit.patch_jax()
    import jax
    assert jax.jit is nbjit.jit

    def pytest_terminal_summary(terminalreporter):
        # The nbjit functions still alive at the end (module-level ones, mostly):
        # shows that the suite's calls went through nbjit, and how.
        table = nbjit.stats()
        total, reasons = collections.Counter(), collections.Counter()
        for s in table.values():
            total.update(calls=s.calls, hits=s.hits, misses=s.misses, slow=s.slow)
            reasons.update(s.slow_reasons)
        terminalreporter.write_line(
            f"nbjit: {len(table)} live jitted functions; calls {total['calls']}, hits "
            f"{total['hits']}, misses {total['misses']}, slow {total['slow']} {dict(reasons)}")
PY

run_mode() {
  local mode=$1
  mkdir -p "$OUT/$mode"
  echo "== $mode $LIB $VERSION (timeout ${SUITE_TIMEOUT}s)" >&2
  (cd "$TREE" && NBJIT_LIBRARY_TESTS_MODE=$mode PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    timeout -k 30 "$SUITE_TIMEOUT" "$PYTHON" -m pytest "$TESTS" -q -p no:cacheprovider \
      -o addopts= --junitxml="$OUT/$mode/$LIB.xml" >"$OUT/$mode/$LIB.log" 2>&1) || true
  tail -n 1 "$OUT/$mode/$LIB.log" >&2
}

for mode in $MODES; do run_mode "$mode"; done
"$PYTHON" "$ROOT/scripts/jax_tests_summary.py" "$OUT"
