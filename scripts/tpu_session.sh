#!/usr/bin/env bash
# Everything the TPU figures in the docs come from, in three device calls of
# under 10 minutes each, on the TPU machines lent to this project (Python
# 3.11, jax 0.10.2 with libtpu; no network, the machine's own package index
# under /opt/pypi). Run from the checkout there, with $OUT set by the device
# tool and the commit named (the checkout that travels has no .git):
#
#   NBJIT_COMMIT=<commit> bash scripts/tpu_session.sh suite   # the accelerator parts 3-5 (~400 s)
#   NBJIT_COMMIT=<commit> bash scripts/tpu_session.sh rest    # part 6 and compare (part 7), the CPU
#                                                             # parts 1-2 beside them (~200 s)
#   NBJIT_COMMIT=<commit> bash scripts/tpu_session.sh probes  # input paths, whole runs, the training loop
#
# Each call first installs numba, llvmlite, pytest-timeout and optax from the
# machine's index into /tmp/site (--no-deps: the machine's jax stays first on
# PYTHONPATH; chex and toolz are not in that index, and naming them stops the
# whole install). What comes back: one tarball per accel_check run (its
# logs, JUnit XML, summary, versions, compare-tpu.json); for `probes`, each
# probe's JSON and log (the training loop's among them). scripts/doc_tables.py turns them into the docs' tables
# (docs/testing.md says where each lands).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: tpu_session.sh suite|rest|probes}
out=${OUT:?OUT: the folder whose files come back}
: "${NBJIT_COMMIT:?NBJIT_COMMIT: the commit this checkout is}"
export PYTHONUNBUFFERED=1

# NBJIT_ACCEL (default tpu) and NBJIT_SKIP_INSTALL=1 try the script where there
# is no TPU (NBJIT_ACCEL=cpu; with NBJIT_ACCEL_CHECK_ARGS=--dry-run, say).
accel=${NBJIT_ACCEL:-tpu}
if [ "${NBJIT_SKIP_INSTALL:-0}" != 1 ]; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: \
    --index-url file:///opt/pypi/simple --no-deps --target /tmp/site \
    numba llvmlite pytest-timeout optax
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
fi

work=$(mktemp -d)
check() {  # check NAME PART...: one accel_check run, its output folder tarred into $OUT
  local name=$1 parts=() p
  shift
  for p in "$@"; do parts+=(--part "$p"); done
  # shellcheck disable=SC2086
  bash scripts/accel_check.sh --accel "$accel" --python python3 --out "$work/$name" \
    "${parts[@]}" ${NBJIT_ACCEL_CHECK_ARGS:-} 2>&1 | tee "$work/$name.log" || true
  mkdir -p "$work/$name"
  tar -C "$work" -czf "$out/$name.tgz" "$name" "$name.log"
}

# The probes and benchmarks import nbjit from this checkout (not installed there).
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"

case "$stage" in
  suite)  # (parts 3, 4 and 5 took 128, 111 and 141 s on the TPU v5e at f28511c)
    check parts-3-5 3 4 5
    ;;
  rest)  # (part 6 took 128 s there, compare 55 s)
    check parts-1-2-6-7 1 2 6 7
    ;;
  probes)  # the accelerator's input paths, the loops and whole runs docs/host-inputs.md quotes
    python3 benchmarks/probes/accel_carrier.py loop safety small --json "$out/accel-carrier.json" \
      2>&1 | grep -v '^loop {' | tee "$out/accel-carrier.log" || true
    python3 benchmarks/probes/accel_runs.py --steps 2000 --repeats 2 --json "$out/accel-runs.json" \
      2>&1 | tee "$out/accel-runs.log" || true
    python3 benchmarks/training_loop.py --widths 512 4096 --rounds 5 --json "$out/training-loop-tpu.json" \
      2>&1 | tee "$out/training-loop-tpu.log" || true
    ;;
  *)
    echo "tpu_session: unknown stage: $stage (suite, rest or probes)" >&2
    exit 2
    ;;
esac
ls -l "$out"
