#!/usr/bin/env bash
# Supervised fine-tuning (SFT) of the CPT'd Qwen2.5-7B on multi-node H100s (examples/configs/sft_7b.yaml).
#
#   # on every node (torchrun rendezvous through the usual variables):
#   NNODES=2 NODE_RANK=$i MASTER_ADDR=node0 VOCAB_SIZE=<expanded length> bash examples/sft_7b.sh
#   NNODES=2 bash examples/sft_7b.sh --dry-run              # config, layout and memory plan (CPU)
#   bash examples/sft_7b.sh --training.train_iters 100       # any dotted override
#
# Before: examples/cpt_7b.sh -> $RUNS/cpt_7b; tools/preprocess_sft.py per source with $TOKENIZER ->
# data/sft/<source>_{conversation,loss_spans}_document.{bin,idx} (the prefixes sft_7b.yaml names).
# Layout: TP=4 (sequence parallel) x PP=1 inside a node, DP = 8 * NNODES / 4, distributed optimizer.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${CONFIG:-examples/configs/sft_7b.yaml}
RUNS=${RUNS:-runs}                        # the checkpoint root every recipe of the chain shares
TOKENIZER=${TOKENIZER:-$RUNS/tokenizer-expanded}
VOCAB_SIZE=${VOCAB_SIZE:-151665}
LOAD=${LOAD:-$RUNS/cpt_7b}
SAVE=${SAVE:-$RUNS/sft_7b}

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

ARGS=(
  --config "$CONFIG"
  --tokenizer.path "$TOKENIZER" --model.vocab_size "$VOCAB_SIZE"
  --training.checkpoint.load "$LOAD" --training.checkpoint.save "$SAVE"
)

if [[ " $* " == *" --dry-run "* ]]; then
  exec "${PYTHON:-python}" tools/pretrain_cpt.py "${ARGS[@]}" --world-size $((NNODES * GPUS_PER_NODE)) "$@"
fi

export CUDA_DEVICE_MAX_CONNECTIONS=1      # TP communication overlaps GEMMs in order
export TOKENIZERS_PARALLELISM=false

exec torchrun \
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  tools/pretrain_cpt.py "${ARGS[@]}" --parallel.backend nccl \
  "$@"
