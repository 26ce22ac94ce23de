#!/usr/bin/env bash
# The toy recipe through SFT (tools/run_toy.py --until sft) at four model sizes, with the same data,
# budgets and seed; `python -m recipes.toy.size_curve OUT [OUT ...]` then draws chrf_source against
# size, one line per OUT's learning rate (one OUT must hold the recipe itself: 4 x 256 at its rates).
#   SHARED=runs/toy/shared OUT=runs/toy_sizes bash recipes/toy/model_size.sh
#   SHARED=runs/toy/shared OUT=runs/toy_sizes_lr5e-4 ARGS="--set all.training.optimizer.lr=5e-4" bash ...
# SHARED: a toy run's shared/ (tokenizers, data, held-out pairs); each size trains its own base.
# SIZES="8 512 1408 8 4;...": other sizes. PARALLEL=1 trains the sizes at once (a GPU machine);
# THREADS: threads per size; ARGS: more
# tools/run_toy.py arguments (ARGS="--iters base=2 cpt=2 sft=2 --eval-sentences 2": a smoke run).
set -euo pipefail
SHARED=$(realpath "${SHARED:-runs/toy/shared}")
OUT=$(realpath -m "${OUT:-runs/toy_sizes}"); THREADS=${THREADS:-2}; PARALLEL=${PARALLEL:-0}; PY=${PY:-python}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# layers hidden ffn heads query-groups: the recipe's size (4 x 256) and one below, two above
IFS=';' read -ra SIZES <<<"${SIZES:-2 128 352 4 2;4 256 704 4 2;6 384 1056 6 2;8 512 1408 8 4}"
for size in "${SIZES[@]}"; do
  read -r layers hidden ffn heads groups <<<"$size"
  run=$OUT/L${layers}_h${hidden}
  mkdir -p "$run/shared"
  for part in bitext tokenizer data; do ln -sfn "$SHARED/$part" "$run/shared/$part"; done
  cmd=("$PY" "$ROOT/tools/run_toy.py" --seeds 0 --out "$run" --until sft --no-report --eval-sentences 50
       --threads "$THREADS" --set "all.model.num_layers=$layers" "all.model.hidden_size=$hidden"
       "all.model.ffn_hidden_size=$ffn" "all.model.num_attention_heads=$heads"
       "all.model.num_query_groups=$groups" "sft.training.checkpoint.save_interval=1500" ${ARGS:-})
  echo "[sizes] L${layers} h${hidden} -> $run"
  if [ "$PARALLEL" = 1 ]; then "${cmd[@]}" >"$run.log" 2>&1 & else "${cmd[@]}" 2>&1 | tee "$run.log"; fi
done
wait
