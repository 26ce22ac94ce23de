#!/usr/bin/env bash
# VEPO RL for Qwen2.5-7B on multi-node H100s with SGLang colocated in the training GPUs.
#
#   # on every node (torchrun rendezvous through the usual variables):
#   NNODES=4 NODE_RANK=$i MASTER_ADDR=node0 bash examples/vepo_rl_7b.sh
#   NNODES=4 bash examples/vepo_rl_7b.sh --dry-run         # validate config + batch shape, print the memory plan (CPU)
#   bash examples/vepo_rl_7b.sh --rl.loss.name dapo         # any dotted override
#
# Before: convert the SFT model (tools/convert_hf.py hf-to-megatron) into training.checkpoint.load.
# Layout per node: 8 GPUs = 2 TP-4 training groups; two TP-4 SGLang engines share the same GPUs with
# mem_fraction_static 0.5 and releases its memory (weights + KV cache) while the policy trains.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${CONFIG:-examples/configs/vepo_7b.yaml}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
if [[ " $* " == *" --dry-run "* ]]; then   # the config, the batch shape and the memory plan per GPU
  exec "${PYTHON:-python}" tools/train_vepo.py --config "$CONFIG" --world-size $((NNODES * GPUS_PER_NODE)) "$@"
fi

MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

export CUDA_DEVICE_MAX_CONNECTIONS=1      # TP communication overlaps GEMMs in order
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TOKENIZERS_PARALLELISM=false

exec torchrun \
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  tools/train_vepo.py --config "$CONFIG" \
  --parallel.backend nccl \
  "$@"
