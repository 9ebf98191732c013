#!/usr/bin/env bash
# Publishes the asv results as a dashboard that opens without internet.
#   cd benchmarks && bash publish.sh [asv publish args...]
# 1. `asv publish`: .asv/results -> .asv/html (asv.conf.json's html_dir).
# 2. offline_dashboard.py: asv's page loads jQuery, flot, bootstrap & co. from
#    CDNs; they are fetched at pinned versions from the npm registry (npm pack,
#    cached in .asv/npm; NBJIT_NPM_CACHE overrides), copied to .asv/html/vendor/
#    and the page's tags point there (their CDN integrity hashes dropped).
# Then serve it on loopback: browsers refuse the page's JSON over file://.
#   ../.venv/bin/asv preview            # http://127.0.0.1:8080, as asv serves it
#   python -m http.server -b 127.0.0.1 -d .asv/html 8080
# ASV picks asv (default ../.venv/bin/asv; its python runs the helper).
set -euo pipefail
asv=${ASV:-../.venv/bin/asv}
here=$(cd "$(dirname "$0")" && pwd)
html_dir=$("$(dirname "$asv")/python" -c '
import sys
from asv.config import Config
print(Config.load("asv.conf.json").html_dir)')
"$asv" publish "$@"
"$(dirname "$asv")/python" "$here/offline_dashboard.py" "$html_dir" \
  --npm-cache "${NBJIT_NPM_CACHE:-.asv/npm}"
echo "publish: serve it with: $asv preview  (or: python -m http.server -b 127.0.0.1 -d $html_dir 8080)" >&2
