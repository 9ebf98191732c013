#!/usr/bin/env bash
# nbjit on an accelerator (a GPU or a TPU), in parts that each fit a 10-minute
# command: the test suite with the accelerator as JAX's default backend, one
# process per part (one program at a time may hold a TPU chip), then
# `python -m nbjit compare` there. Works without network: from what is
# installed (--python) or from a wheelhouse (PIP_FIND_LINKS=DIR PIP_NO_INDEX=1).
#
#   bash scripts/accel_check.sh [OPTIONS] [-- PYTEST ARGS...]
#
#   --list-parts       print the parts (what each runs, on which backend) and exit
#   --part N           run part N only (repeatable; default: every part in turn,
#                      the CPU part beside the others)
#   --out DIR          logs, JUnit XML, compare JSON, versions and a summary
#                      (default: accel-check-out)
#   --python PY        use this interpreter as it is (jax with the accelerator's
#                      plugin already in it; nothing is installed); nbjit is
#                      imported from this checkout (put first on PYTHONPATH)
#   --accel gpu|tpu    the accelerator, instead of detecting it (cpu: the same
#                      parts on the CPU, to try this script where there is none)
#   --jax VERSION      jax/jaxlib to install into the venv (default: the newest
#                      supported one pip finds for the venv's Python)
#   --compare-args A   arguments of `nbjit compare` (default: --quick)
#   --part-timeout S   seconds a part may run (default 560); the part is then
#                      interrupted, and what ran is reported
#   --dry-run          print what would run (and what was detected), run nothing
#   -- ARGS            passed to every pytest part (default: -m "not slow")
#
# Environment: NBJIT_VENV (default .venv-gpu / .venv-tpu), NBJIT_PYTHON (the
# venv's interpreter, default python3's version), NBJIT_CUDA_EXTRA (default
# cuda12), NBJIT_COMMIT (the commit to report where the checkout has no .git).
# Detection: nvidia-smi listing a GPU, else libtpu installed for the
# interpreter (or /dev/accel*, /dev/vfio), else JAX's default backend there.
# Each accelerator part then checks that JAX's default backend is the
# accelerator (NBJIT_EXPECT_BACKEND, tests/conftest.py), and names the device
# and versions in its header. Tests that assume the 8 host CPU devices, or
# anything else of the backend, skip there with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

# The parts: "backend|files". A "cpu" part runs with JAX_PLATFORMS=cpu: tests
# that do not depend on the backend (nbjit's structure and tooling, the docs'
# examples and tables, which describe CPU runs, and the tests whose work runs in
# Python processes they start, which run JAX on the CPU beside a session that
# holds an accelerator: `nbjit run`, donated reuse, the multi-process pairs).
# It needs no accelerator and may run beside an accelerator part. "accel"
# parts hold the accelerator, one at a time; the last one also takes every
# test file no part names (a new file is never left out). "compare" is `nbjit
# compare`. Sized from CPU durations (about 650 s for the whole suite on 2
# shared cores) and the first TPU v5e run (the suite took over 15 minutes in
# one process there; compiles cost more): each part well under 560 s.
PARTS=(
  "cpu|tests/test_structure.py tests/test_layers.py tests/test_table.py tests/test_kernels.py tests/test_agreement_scale.py tests/test_agreement.py tests/test_agreement_late.py tests/test_generated_code.py tests/test_notebooks.py tests/test_docs.py tests/tools"
  "cpu|tests/test_multiprocess.py tests/test_agreement_processes.py tests/test_run.py tests/test_donated_reuse.py"
  "accel|tests/test_jit.py tests/test_jit_surface.py tests/test_jit_keys.py tests/test_bad_input.py tests/test_footguns.py tests/test_tracebacks.py tests/test_refs.py tests/test_eval_shape.py tests/test_object_surface.py tests/test_clear_caches.py tests/test_cache_obj_config.py tests/test_compile_failures.py tests/test_threads.py tests/test_transfer_guard.py tests/test_patch.py"
  "accel|tests/test_explain.py tests/test_explain_structure.py tests/test_miss_diagnostics.py tests/test_stats.py tests/test_profile.py tests/test_spans.py tests/test_fuzz.py"
  "accel|tests/test_memory.py tests/test_pytree_keys.py tests/test_filter_jit.py tests/test_filter_keyed.py tests/test_filter_jit_routing.py"
  "accel|tests/test_host_inputs.py tests/test_sharding.py tests/test_fresh_host_values.py tests/test_staged_inputs.py tests/test_resident.py tests/test_resident_big.py tests/test_host_policy.py"
  "compare|"
)

list_parts=0
dry_run=0
parts_wanted=()
out=accel-check-out
python=""
accel=""
jax_version=""
compare_args="--quick"
part_timeout=560
pytest_args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --list-parts) list_parts=1 ;;
    --part) parts_wanted+=("${2:?--part needs a number}"); shift ;;
    --part=*) parts_wanted+=("${1#--part=}") ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --out=*) out=${1#--out=} ;;
    --python) python=${2:?--python needs an interpreter}; shift ;;
    --python=*) python=${1#--python=} ;;
    --accel) accel=${2:?--accel needs gpu or tpu}; shift ;;
    --accel=*) accel=${1#--accel=} ;;
    --jax) jax_version=${2:?--jax needs a version}; shift ;;
    --jax=*) jax_version=${1#--jax=} ;;
    --compare-args) compare_args=${2?--compare-args needs arguments}; shift ;;
    --compare-args=*) compare_args=${1#--compare-args=} ;;
    --part-timeout) part_timeout=${2:?--part-timeout needs seconds}; shift ;;
    --part-timeout=*) part_timeout=${1#--part-timeout=} ;;
    --dry-run) dry_run=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "accel_check: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "${#pytest_args[@]}" -eq 0 ]; then
  pytest_args=(-m "not slow")
fi
lowest=0.10.2
first_unsupported=0.13

say() { echo "accel_check: $*" >&2; }
die() { echo "accel_check: error: $*" >&2; exit 1; }
quoted() {  # a command line as it would be typed
  local shown="" arg
  for arg in "$@"; do
    case "$arg" in
      *[[:space:]\"\'\|\&\;\<\>\(\)\$]*|"") shown+=" '$arg'" ;;
      *) shown+=" $arg" ;;
    esac
  done
  echo "${shown# }"
}

# Every test file a part names, and those no part names (the last accel part's).
named_files() {
  local part files
  for part in "${PARTS[@]}"; do
    files=${part#*|}
    [ -n "$files" ] && printf '%s\n' $files
  done
}
unnamed_files() {
  local named file covered dir
  named=$(named_files)
  for file in tests/test_*.py tests/tools/test_*.py; do
    covered=0
    while IFS= read -r dir; do
      [ -z "$dir" ] && continue
      case "$file" in "$dir"|"$dir"/*) covered=1 ;; esac
    done <<< "$named"
    [ "$covered" -eq 0 ] && echo "$file"
  done
  return 0
}
last_accel=0
for i in "${!PARTS[@]}"; do
  [ "${PARTS[$i]%%|*}" = accel ] && last_accel=$((i + 1))
done
part_backend() { echo "${PARTS[$(($1 - 1))]%%|*}"; }
part_files() {
  local files=${PARTS[$(($1 - 1))]#*|}
  if [ "$1" -eq "$last_accel" ]; then
    files="$files $(unnamed_files | tr '\n' ' ')"
  fi
  echo $files
}

if [ "$list_parts" -eq 1 ]; then
  for i in "${!PARTS[@]}"; do
    n=$((i + 1))
    case "$(part_backend "$n")" in
      cpu) echo "part $n (JAX_PLATFORMS=cpu; may run beside an accelerator part): pytest $(part_files "$n")" ;;
      accel) echo "part $n (the accelerator, alone): pytest $(part_files "$n")" ;;
      compare) echo "part $n (the accelerator, alone): python -m nbjit compare $compare_args" ;;
    esac
  done
  exit 0
fi
for n in "${parts_wanted[@]}"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "${#PARTS[@]}" ] ||
    die "no part $n (--list-parts shows 1 to ${#PARTS[@]})"
done
if [ "${#parts_wanted[@]}" -eq 0 ]; then
  for i in "${!PARTS[@]}"; do parts_wanted+=("$((i + 1))"); done
fi

# 1. Which interpreter, which accelerator? (Without starting JAX's backend:
# on a TPU that would hold the chip for this process.)
probe=${python:-python3}
if [ -z "$accel" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    accel=gpu
  elif "$probe" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("libtpu") is None)' 2>/dev/null ||
       compgen -G "/dev/accel*" >/dev/null || [ -d /dev/vfio ]; then
    accel=tpu
  else
    backend=$("$probe" -c 'import jax; print(jax.default_backend())' 2>/dev/null || true)
    case "$backend" in
      gpu|tpu) accel=$backend ;;
      *) [ "$dry_run" -eq 1 ] || die "no accelerator here: no nvidia-smi listing a GPU, no libtpu for $probe, and JAX's default backend there is ${backend:-not importable}. Run this on a GPU or TPU machine, or pass --accel (CPU tests: bash scripts/test.sh)."
         say "no accelerator found (a real run stops here); dry run goes on as tpu"
         accel=tpu ;;
    esac
  fi
fi
case "$accel" in gpu|tpu|cpu) ;; *) die "--accel must be gpu, tpu or cpu, not $accel" ;; esac

# 2. The environment.
if [ -n "$python" ]; then
  PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's nbjit first; the rest kept
  export PYTHONPATH
else
  venv=${NBJIT_VENV:-.venv-$accel}
  case "$accel" in
    gpu) jax_req="jax[${NBJIT_CUDA_EXTRA:-cuda12}]" ;;
    tpu) jax_req="jax[tpu]" ;;
    cpu) jax_req=jax ;;
  esac
  if [ -n "$jax_version" ]; then
    reqs=("$jax_req==$jax_version" "jaxlib==$jax_version")
  else
    reqs=("$jax_req>=$lowest,<$first_unsupported")
  fi
  if [ -z "${NBJIT_PYTHON:-}" ]; then
    NBJIT_PYTHON=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    export NBJIT_PYTHON
  fi
  say "venv $venv (Python $NBJIT_PYTHON): bootstrap.sh with $(quoted "${reqs[@]}")"
  if [ "$dry_run" -eq 0 ]; then
    bash scripts/bootstrap.sh "$venv" "${reqs[@]}"
  fi
  python=$venv/bin/python
fi

# 3. What runs where, on which versions (read from the installed packages; the
# device itself is named by each part's pytest header and compare's metadata).
commit=${NBJIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ "$commit" != unknown ] && [ -z "${NBJIT_COMMIT:-}" ] &&
   [ -n "$(git status --porcelain --untracked-files=no -- nbjit 2>/dev/null)" ]; then
  commit+="+dirty"
fi
export NBJIT_COMMIT=$commit
mkdir -p "$out"
versions_py='
import importlib.metadata as md, os, platform, sys
def v(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return "-"
print("host", platform.node(), "|", platform.machine(), os.cpu_count(), "CPUs")
print("python", platform.python_version(), sys.executable)
print("jax", v("jax"), "| jaxlib", v("jaxlib"), "| libtpu", v("libtpu", "libtpu-nightly"),
      "| jax-cuda plugin", v("jax-cuda12-plugin", "jax-cuda13-plugin"))
print("numba", v("numba"), "| numpy", v("numpy"), "| pytest", v("pytest"),
      "| equinox", v("equinox"), "| optax", v("optax"), "| ruff", v("ruff"))
'
{
  echo "accelerator: $accel ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo "nbjit: commit $commit, from $(pwd)"
  if [ -x "$python" ] || command -v "$python" >/dev/null 2>&1; then
    "$python" -c "$versions_py" || echo "python: $python does not run"
  else
    echo "python: $python (not there yet: dry run)"
  fi
  if [ "$accel" = gpu ] && command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
      sed 's/^/gpu: /'
  fi
  echo "parts: ${parts_wanted[*]} of ${#PARTS[@]}; pytest $(quoted "${pytest_args[@]}"); out $out"
} | tee "$out/versions.txt" >&2

# 4. The parts.
summary=$out/summary.txt
: > "$summary"
count_junit() {  # "12 passed, 1 failed, 3 skipped, 0 errors" from a JUnit XML file
  "$python" - "$1" <<'EOF' 2>/dev/null || echo "no JUnit XML"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(f"{n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, {n['failures']} failed, "
      f"{n['skipped']} skipped, {n['errors']} errors")
EOF
}
run_part() {  # run_part N: one process; its log, XML and a summary line under $out
  local n=$1 backend files log status=0 start
  backend=$(part_backend "$n")
  log=$out/part-$n.log
  start=$(date +%s)
  local cmd env_prefix=()
  case "$backend" in
    cpu) env_prefix=(env JAX_PLATFORMS=cpu)
         files=$(part_files "$n")
         # shellcheck disable=SC2086
         cmd=("$python" -m pytest $files "${pytest_args[@]}" -p no:cacheprovider
              --durations=15 --junitxml "$out/part-$n.xml") ;;
    accel) env_prefix=(env "NBJIT_EXPECT_BACKEND=$accel")
           files=$(part_files "$n")
           # shellcheck disable=SC2086
           cmd=("$python" -m pytest $files "${pytest_args[@]}" -p no:cacheprovider
                --durations=15 --junitxml "$out/part-$n.xml") ;;
    compare) # shellcheck disable=SC2086
             cmd=("$python" -m nbjit compare $compare_args --no-progress
                  --json "$out/compare-$accel.json" --markdown "$out/compare-$accel.md") ;;
  esac
  echo "accel_check: part $n ($backend): $(quoted "${env_prefix[@]}" "${cmd[@]}")" | tee "$log" >&2
  [ "$dry_run" -eq 1 ] && return 0
  timeout -s INT -k 30 "$part_timeout" "${env_prefix[@]}" "${cmd[@]}" >> "$log" 2>&1 || status=$?
  local counts="exit $status"
  [ "$backend" != compare ] && counts="$(count_junit "$out/part-$n.xml"), exit $status"
  [ "$status" -eq 124 ] && counts+=" (interrupted after ${part_timeout} s)"
  echo "part $n ($backend): $counts, $(( $(date +%s) - start )) s" | tee -a "$summary" >&2
  return "$status"
}

status=0
cpu_parts=() accel_parts=()
for n in "${parts_wanted[@]}"; do
  if [ "$(part_backend "$n")" = cpu ]; then cpu_parts+=("$n"); else accel_parts+=("$n"); fi
done
cpu_pid=""
if [ "${#cpu_parts[@]}" -gt 0 ]; then
  run_cpu_parts() {  # one after another: each is a pytest process of its own
    local n rc=0
    for n in "${cpu_parts[@]}"; do run_part "$n" || rc=$?; done
    return "$rc"
  }
  if [ "${#accel_parts[@]}" -gt 0 ] && [ "$dry_run" -eq 0 ]; then
    say "parts ${cpu_parts[*]} (JAX_PLATFORMS=cpu) run beside the accelerator parts"
    run_cpu_parts & cpu_pid=$!  # they hold no accelerator
  else
    run_cpu_parts || status=$?
  fi
fi
for n in "${accel_parts[@]}"; do
  [ "$dry_run" -eq 1 ] || say "part $n: running (log $out/part-$n.log)"
  run_part "$n" || status=$?
  [ "$dry_run" -eq 1 ] || tail -n 25 "$out/part-$n.log" >&2
done
if [ -n "$cpu_pid" ]; then
  wait "$cpu_pid" || status=$?
fi
if [ "$dry_run" -eq 1 ]; then
  say "dry run: nothing was run"
  exit 0
fi
echo "== accel_check summary ($accel, nbjit $commit) ==" >&2
cat "$out/versions.txt" "$summary" >&2
[ "$status" -eq 0 ] && say "done: every part passed; $out" || say "FAILED (exit $status): see $out/part-*.log"
exit "$status"
