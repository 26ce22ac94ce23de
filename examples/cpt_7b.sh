#!/usr/bin/env bash
# Continued pre-training (CPT) of Qwen2.5-7B with the expanded tokenizer on multi-node H100s.
#
#   # on every node (torchrun rendezvous through the usual variables):
#   NNODES=8 NODE_RANK=$i MASTER_ADDR=node0 bash examples/cpt_7b.sh
#   NNODES=8 bash examples/cpt_7b.sh --dry-run              # validate config + layout only (CPU)
#   bash examples/cpt_7b.sh --training.train_iters 100       # any dotted override
#
# Before:
#   1. tools/expand_tokenizer.py -> $TOKENIZER (vocab size $VOCAB_SIZE = its length)
#   2. tools/convert_hf.py hf-to-megatron Qwen2.5-7B, embeddings resized to the expanded vocab,
#      -> $INIT_CKPT (a weights-only dist checkpoint; loaded once, then the run resumes from $SAVE)
#   3. tools/preprocess_data.py per language with $TOKENIZER -> $DATA/cpt_<lang>_text_document.{bin,idx}
#
# Layout: TP=4 (sequence parallel) x PP=1 inside a node, DP = 8 * NNODES / 4 (16 on 8 nodes),
# distributed optimizer (ZeRO-1), bf16 weights with FP8 (hybrid, delayed scaling) GEMMs through
# Transformer Engine, micro batch 1 x 4096 tokens, gradient accumulation = 1024 / DP.
#
# The 200B-token schedule (SPEC section 2):
#   tokens/step  = global batch 1024 x 4096 = 4,194,304
#   train_iters  = 200e9 / 4,194,304 = 47,684 steps
#   blend        = English 0.5 : low-resource 0.5 (th ms km lo my fil id vi, equal 1/16 each),
#                  so ~100B English tokens and ~12.5B per low-resource language
#   LR           = 500 warmup steps (~2.1B tokens) to 1e-5, cosine to 1e-6 over all 47,684 steps
#   checkpoints  = every 1,000 steps (~4.2B tokens), newest 3 kept; a relaunch resumes exactly
#   compute      = ~6 x 7.6e9 params x 200e9 tokens ~ 9.1e21 FLOPs: ~4 days on 64 H100s at 40% MFU
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${CONFIG:-examples/configs/qwen2.5-7b.yaml}
RUNS=${RUNS:-runs}                        # the checkpoint root every recipe of the chain shares
TOKENIZER=${TOKENIZER:-$RUNS/tokenizer-expanded}
VOCAB_SIZE=${VOCAB_SIZE:-151665}
INIT_CKPT=${INIT_CKPT:-$RUNS/qwen2.5-7b-expanded-mcore}
SAVE=${SAVE:-$RUNS/cpt_7b}
DATA=${DATA:-data/cpt}

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

ARGS=(
  --config "$CONFIG"
  --tokenizer.path "$TOKENIZER" --model.vocab_size "$VOCAB_SIZE"
  --parallel.tensor_model_parallel_size 4 --parallel.pipeline_model_parallel_size 1
  --parallel.sequence_parallel true
  --model.fp8.format hybrid --model.fp8.recipe delayed --training.bf16 true
  --training.micro_batch_size 1 --training.global_batch_size 1024 --training.seq_length 4096
  --training.train_iters 47684
  --training.optimizer.lr 1.0e-5 --training.optimizer.min_lr 1.0e-6
  --training.optimizer.use_distributed_optimizer true
  --training.scheduler.warmup_iters 500 --training.scheduler.decay_style cosine
  --training.checkpoint.save "$SAVE" --training.checkpoint.save_interval 1000 --training.checkpoint.keep_last 3
  --training.checkpoint.load "$INIT_CKPT" --training.checkpoint.finetune true
  --training.eval_interval 1000 --training.eval_iters 10 --training.logging.log_interval 10
  --data.mode cpt --data.english_weight 0.5 --data.split "998,2,0" --data.cache_dir "$DATA/cache"
)
for lang in en th ms km lo my fil id vi; do
  ARGS+=(--data.paths."$lang" "$DATA/cpt_${lang}_text_document")
done

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
