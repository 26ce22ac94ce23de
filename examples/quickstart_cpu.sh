#!/usr/bin/env bash
# The CPU quickstart: the whole pipeline on a tiny model. Run through `make quickstart`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/quickstart}
echo "quickstart: work directory $OUT (stages are filled in as the pipeline lands)"
mkdir -p "$OUT"
