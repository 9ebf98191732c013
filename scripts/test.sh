#!/usr/bin/env bash
# Sets up a venv (.venv, Python 3.12) with nbjit and its test, bench and equinox
# extras (see bootstrap.sh), and runs the test suite: no test skips for want of equinox.
# NBJIT_PYTHON=3.13 (with e.g. NBJIT_VENV=.venv-py313) tests on Python 3.13;
# NBJIT_PYTHON=3.11 NBJIT_VENV=.venv-py311 NBJIT_EXTRA_REQS="jax==0.10.2 jaxlib==0.10.2"
# on the lowest supported stack (the TPU machines').
#   bash scripts/test.sh [pytest args...]      (default: -m "not slow")
# NBJIT_VENV and NBJIT_EXTRA_REQS (space-separated pip requirements) select
# another venv / jax version, e.g. NBJIT_VENV=.venv-jax0112
# NBJIT_EXTRA_REQS="jax==0.11.2 jaxlib==0.11.2".
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${NBJIT_VENV:-.venv}
# shellcheck disable=SC2086
bash scripts/bootstrap.sh "$venv" ${NBJIT_EXTRA_REQS:-}
if [ "$#" -eq 0 ]; then
  set -- -m "not slow"
fi
NBJIT_REQUIRE_EQUINOX=1 "$venv/bin/python" -m pytest "$@"  # tests/conftest.py
