#!/usr/bin/env bash
# The CPU quickstart (run through `make quickstart`): the whole VEPO pipeline on the toy model
# (recipes/toy/configs/), on 2 CPU cores, in under ten minutes, nothing downloaded:
#   tokenizer expansion + trimmed vocabulary -> base -> embedding resize -> CPT (1:1) -> SFT
#   -> VEPO RL -> held-out evaluation of the policy before SFT, after SFT and after RL
#   (tools/run_toy.py with short stage budgets) -> reward model from the SFT checkpoint
#   -> FLORES scores of the held-out translations -> summary with 95% intervals and plots.
# `make toy` adds what the quickstart leaves out: parallel text from Debian localisation packages
# (tools/build_parallel_corpus.py, fetched with apt-get) in CPT and SFT, en-id/id-en, longer stages, 3 seeds.
# Knobs (environment): OUT, BASE_ITERS, CPT_ITERS, SFT_ITERS, RL_ITERS, RM_ITERS, EVAL_SENTENCES, DIRECTIONS,
# TOY_ARGS (more tools/run_toy.py flags, e.g. "--set all.model.num_layers=2").
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
OUT=${OUT:-runs/quickstart}
BASE_ITERS=${BASE_ITERS:-10}
CPT_ITERS=${CPT_ITERS:-30}
SFT_ITERS=${SFT_ITERS:-150}
RL_ITERS=${RL_ITERS:-16}
RM_ITERS=${RM_ITERS:-30}
EVAL_SENTENCES=${EVAL_SENTENCES:-16}
DIRECTIONS=${DIRECTIONS:-en-th,en-vi,th-en,vi-en}
TOY_ARGS=${TOY_ARGS:-}
export TOKENIZERS_PARALLELISM=false

stage() { printf '\n== [%s] %s (%s)\n' "$1" "$2" "$(date +%H:%M:%S)"; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rm -rf "$OUT"
mkdir -p "$OUT"
SEED="$OUT/toy/seed0"

# At these budgets the quickstart keeps the toy's second configuration for RL: prompts from the
# sentences SFT trained on. With the toy's hold-out, the e2e variant's short SFT on
# 800 sentences lifted held-out language only 40 -> 58.75% (the test asks for > +20 points). Its
# SFT trains on single sentences (the toy also on joined pairs: longer sequences, more minutes),
# and RL's last checkpoint is evaluated (the toy keeps 50 RL sentences to choose one by). Its short
# base, CPT and SFT keep the rate 2e-3: the toy's 5e-4 is chosen for its full budgets. It trains in
# fp32 where the toy trains in bf16: bf16 is fast only on CPUs with AMX, and a newcomer's may not have it.
# Its 16 RL steps take one update a rollout batch at 1e-4 from K = G = 4 filtered samples a prompt
# (the toy: four at 2.5e-5 from 4 unfiltered samples, for its 200 steps).
stage 1/4 "toy recipe: tokenizer -> base -> resize -> CPT -> SFT -> VEPO RL -> held-out eval (tools/run_toy.py)"
# shellcheck disable=SC2086  # TOY_ARGS is a list of flags
"$PY" tools/run_toy.py --out "$OUT/toy" --seeds 0 --directions "$DIRECTIONS" --eval-sentences "$EVAL_SENTENCES" \
  --iters base="$BASE_ITERS" cpt="$CPT_ITERS" sft="$SFT_ITERS" rl="$RL_ITERS" --no-report \
  --rl-holdout 0 --rl-validation 0 --sft-window 1 --no-bitext --vocab-min-count 1 --set all.training.logging.log_interval=5 \
  base.training.optimizer.lr=2e-3 cpt.training.optimizer.lr=2e-3 sft.training.optimizer.lr=2e-3 \
  rl.rl.mini_batches=1 rl.rl.filtering.num_candidates=4 rl.rl.filtering.enabled=true rl.training.micro_batch_size=16 \
  rl.training.optimizer.lr=1e-4 rl.training.optimizer.min_lr=1e-4 all.training.bf16=false $TOY_ARGS

stage 2/4 "reward model from the SFT checkpoint: corrupted FLORES pairs, 10 error categories"
MODEL=$("$PY" - "$SEED/sft" <<'EOF'
import sys
from vepo_mcore.training.checkpointing import checkpoint_config
cfg, _ = checkpoint_config(sys.argv[1])
m = cfg.model
print(f"--model.num_layers {m.num_layers} --model.hidden_size {m.hidden_size} --model.ffn_hidden_size "
      f"{m.ffn_hidden_size} --model.num_attention_heads {m.num_attention_heads} --model.num_query_groups "
      f"{m.num_query_groups} --model.vocab_size {m.vocab_size} --model.tie_word_embeddings "
      f"{str(m.tie_word_embeddings).lower()} --tokenizer.path {cfg.tokenizer.path}")
EOF
)
# shellcheck disable=SC2086  # MODEL is a list of flags
"$TORCHRUN" --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$(free_port)" tools/train_rm.py \
  --config examples/configs/rm_tiny.yaml $MODEL --rm.init_from "$SEED/sft" --rm.train_lines 60 --rm.test_lines 10 \
  --training.train_iters "$RM_ITERS" --training.checkpoint.save "$OUT/rm" --rm.report_dir "$OUT/rm_eval" > "$OUT/rm.log" 2>&1

stage 3/4 "FLORES devtest scores of the held-out translations, paired bootstrap RL vs SFT (tools/evaluate.py)"
"$PY" tools/evaluate.py --eval.system.hyp_dir "$SEED/hyps_rl" --eval.system.name rl \
  --eval.baseline.hyp_dir "$SEED/hyps_sft" --eval.baseline.name sft --eval.directions "$DIRECTIONS" \
  --eval.max_sentences "$EVAL_SENTENCES" --eval.out_dir "$OUT/eval_rl" > "$OUT/eval_rl.log"

stage 4/4 "summary"
"$PY" tools/quickstart_summary.py "$OUT"
echo "make toy adds parallel text from Debian localisation packages (apt-get) to CPT and SFT, en-id/id-en, longer stages and 3 seeds: reports/toy/README.md"
