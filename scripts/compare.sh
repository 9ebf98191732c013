#!/usr/bin/env bash
# Sets up a venv (.venv, Python 3.12; see bootstrap.sh) with nbjit and compares nbjit.jit with
# jax.jit side by side in one process: a table on stdout, a PNG plot and the JSON
# (it says on stderr where it wrote them).
#   bash scripts/compare.sh [compare args...]  (default: --plot compare.png --json compare.json)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh .venv
if [ "$#" -eq 0 ]; then
  set -- --plot compare.png --json compare.json
fi
.venv/bin/python -m nbjit compare "$@"
