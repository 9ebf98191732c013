#!/usr/bin/env bash
# nbjit on an NVIDIA GPU, in one command: a venv with the CUDA jaxlib, the test
# suite on the GPU backend, and `python -m nbjit compare --quick` with the GPU
# as the default device. A few minutes once the wheels are there.
#
#   bash scripts/gpu_check.sh [--dry-run] [--jax VERSION] [--python PY] [-- PYTEST ARGS...]
#
#   --dry-run       print what would run (and what was detected), run nothing
#   --jax VERSION   the jax/jaxlib version to install (default: the one found in
#                   the venv or --python, if supported; else 0.11.2, which the
#                   GPU machines have had)
#   --python PY     use this interpreter as it is (jax with CUDA already in it,
#                   e.g. a machine without network); nothing is installed; nbjit
#                   is imported from this checkout
#   -- ARGS         passed to pytest (default: -m "not slow" -q)
# Environment: NBJIT_VENV (default .venv-gpu), NBJIT_CUDA_EXTRA (default
# cuda12: pip's jax[cuda12]; cuda12-local uses a CUDA already installed),
# NBJIT_GPU_TIMEOUT (seconds per step, default 1200); pip's own variables
# (PIP_FIND_LINKS=wheels/ PIP_NO_INDEX=1) install from a local wheelhouse.
# Tests that assume 8 CPU devices skip with a reason when the default backend
# is not CPU (the `cpu_devices` marker, tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
jax_version=""
python=""
pytest_args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --jax) jax_version=${2:?--jax needs a version}; shift ;;
    --jax=*) jax_version=${1#--jax=} ;;
    --python) python=${2:?--python needs an interpreter}; shift ;;
    --python=*) python=${1#--python=} ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "${#pytest_args[@]}" -eq 0 ]; then
  pytest_args=(-m "not slow" -q)
fi
venv=${NBJIT_VENV:-.venv-gpu}
cuda_extra=${NBJIT_CUDA_EXTRA:-cuda12}
step_timeout=${NBJIT_GPU_TIMEOUT:-1200}
lowest=0.11.2
first_unsupported=0.13.0

say() { echo "gpu_check: $*" >&2; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }
run() {  # prints the command; runs it unless --dry-run, under the step timeout
  local shown="+" arg
  for arg in "$@"; do
    case "$arg" in
      *[[:space:]]*|"") shown+=" '$arg'" ;;
      *) shown+=" $arg" ;;
    esac
  done
  echo "$shown" >&2
  if [ "$dry_run" -eq 0 ]; then
    timeout "$step_timeout" "$@"
  fi
}
version_ok() {  # lowest <= $1 < first_unsupported (numeric, dotted)
  [ "$(printf '%s\n%s\n' "$lowest" "$1" | sort -V | head -n1)" = "$lowest" ] &&
    [ "$(printf '%s\n%s\n' "$1" "$first_unsupported" | sort -V | head -n1)" = "$1" ] &&
    [ "$1" != "$first_unsupported" ]
}

# 1. A GPU?
if ! command -v nvidia-smi >/dev/null 2>&1; then
  if [ "$dry_run" -eq 1 ]; then
    say "no nvidia-smi on this machine (a real run stops here); dry run goes on"
  else
    die "no NVIDIA GPU here: nvidia-smi is not on the PATH. Run this on a machine with an NVIDIA GPU and its driver (CPU tests: bash scripts/test.sh)."
  fi
elif ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2; then
  [ "$dry_run" -eq 1 ] || die "nvidia-smi is there but lists no GPU (driver not loaded?)"
fi

# 2. Which jax?
probe=${python:-$venv/bin/python}
found=""
if [ -x "$probe" ] || command -v "$probe" >/dev/null 2>&1; then
  found=$("$probe" -c 'import jax; print(jax.__version__)' 2>/dev/null || true)
fi
if [ -z "$jax_version" ]; then
  if [ -n "$found" ] && version_ok "$found"; then
    jax_version=$found
  else
    jax_version=$lowest
  fi
fi
version_ok "$jax_version" ||
  die "jax $jax_version is outside what nbjit supports (>= $lowest, < $first_unsupported)"
say "jax $jax_version (found: ${found:-none}); CUDA extra: $cuda_extra"

# 3. The environment.
if [ -n "$python" ]; then
  say "using $python as it is (no install); nbjit from $(pwd)"
  PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
else
  # bootstrap.sh makes the venv and installs nbjit[test,bench]; the CUDA wheels
  # of the same version go on top (jax[cuda12] pulls jax-cuda12-plugin and
  # jax-cuda12-pjrt of that version, and NVIDIA's CUDA wheels).
  run bash scripts/bootstrap.sh "$venv" "jax[$cuda_extra]==$jax_version" "jaxlib==$jax_version"
  python=$venv/bin/python
fi

# 4. Is the GPU JAX's default backend?
check_backend='import jax, jaxlib, nbjit; b = jax.default_backend(); print("gpu_check: jax", jax.__version__, "jaxlib", jaxlib.__version__, "backend", b, jax.devices(), "nbjit from", nbjit.__file__); b == "gpu" or exit("gpu_check: error: JAX default backend is %r, not gpu: the CUDA plugin did not load (pip list | grep jax-cuda; the driver must be new enough for the CUDA wheels)" % b)'
run "$python" -c "$check_backend"

# 5. The test suite on the GPU backend, then the comparison.
status=0
run "$python" -m pytest "${pytest_args[@]}" || status=$?
run "$python" -m nbjit compare --quick --json compare-gpu.json || status=$?
# Fresh host values: packed into one host-to-device copy per call (the default
# there: resident slots need puts that alias host memory, which a GPU's do not),
# then per-leaf puts (packing off), to see what one copy instead of N gives there.
for pack in 1 0; do
  NBJIT_PACK_HOST_INPUTS=$pack run "$python" -m nbjit compare --quick --only '^(.*_new_values|workload_.*)$' \
    --json "compare-gpu-pack$pack.json" || status=$?
done
if [ "$dry_run" -eq 1 ]; then
  say "dry run: nothing was run"
elif [ "$status" -eq 0 ]; then
  say "done: tests passed; comparison table above, compare-gpu.json"
else
  say "FAILED (exit $status): see the output above"
fi
exit "$status"
