#!/usr/bin/env bash
# The CPU quickstart (run through `make quickstart`): the whole VEPO pipeline on a tiny
# Qwen2.5-shaped model, on 2 CPU processes (gloo), in about ten minutes:
#   FLORES corpora -> CPT (1:1 English : low-resource) -> SFT (ChatML, 3-phase curriculum)
#   -> reward model from the SFT checkpoint (10 error categories) -> evaluation of the SFT model
#   -> VEPO RL with the embedded engine -> evaluation again
#   -> summary (reward, constraint pass rates, RM accuracy, chrF before/after RL, plot paths).
# Knobs (environment): OUT, NPROC, CPT_ITERS, SFT_ITERS, RM_ITERS, RL_ITERS, EVAL_SENTENCES, DIRECTIONS.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
TORCHRUN=${TORCHRUN:-.venv/bin/torchrun}
OUT=${OUT:-runs/quickstart}
NPROC=${NPROC:-2}
CPT_ITERS=${CPT_ITERS:-60}
SFT_ITERS=${SFT_ITERS:-40}
RM_ITERS=${RM_ITERS:-100}
RL_ITERS=${RL_ITERS:-8}
EVAL_SENTENCES=${EVAL_SENTENCES:-16}
DIRECTIONS=${DIRECTIONS:-en-th,th-en,en-vi,zh-en}
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

stage() { printf '\n== [%s] %s (%s)\n' "$1" "$2" "$(date +%H:%M:%S)"; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
launch() { "$TORCHRUN" --nproc-per-node "$NPROC" --master-addr 127.0.0.1 --master-port "$(free_port)" "$@"; }
rm -rf "$OUT"
mkdir -p "$OUT"

stage 1/8 "data: FLORES dev -> Megatron indexed CPT corpus per language, ChatML SFT set"
"$PY" tools/build_cpt_corpus.py --output-dir data/cpt_tiny
"$PY" tools/build_sft_data.py --output-dir data/sft_tiny

stage 2/8 "continued pre-training, English 0.5 : low-resource 0.5"
launch tools/pretrain_cpt.py --config examples/configs/cpt_tiny.yaml \
  --training.train_iters "$CPT_ITERS" --training.checkpoint.save "$OUT/cpt"

stage 3/8 "SFT from the CPT checkpoint (assistant-only loss, 3 phases)"
launch tools/pretrain_cpt.py --config examples/configs/sft_tiny.yaml \
  --training.train_iters "$SFT_ITERS" --training.checkpoint.load "$OUT/cpt" \
  --training.checkpoint.finetune true --training.checkpoint.save "$OUT/sft"

stage 4/8 "reward model from the SFT checkpoint: corrupted FLORES pairs, 10 error categories"
launch tools/train_rm.py --config examples/configs/rm_tiny.yaml --rm.init_from "$OUT/sft" \
  --rm.train_lines 60 --rm.test_lines 10 --training.train_iters "$RM_ITERS" \
  --training.checkpoint.save "$OUT/rm" --rm.report_dir "$OUT/rm_eval" > "$OUT/rm.log"

stage 5/8 "translate + evaluate the SFT model on FLORES devtest ($DIRECTIONS, $EVAL_SENTENCES sentences)"
"$PY" tools/evaluate.py --checkpoint "$OUT/sft" --directions "$DIRECTIONS" --max-sentences "$EVAL_SENTENCES" \
  --max-new-tokens 48 --out "$OUT/eval_sft" > "$OUT/eval_sft.log"

stage 6/8 "VEPO RL from the SFT checkpoint (embedded engine, RLVR rewards)"
launch tools/train_vepo.py --config examples/configs/vepo_tiny.yaml \
  --training.train_iters "$RL_ITERS" --training.checkpoint.load "$OUT/sft" \
  --training.checkpoint.save "$OUT/rl" --rl.directions "$DIRECTIONS"

stage 7/8 "translate + evaluate the RL model, paired bootstrap against the SFT model"
"$PY" tools/evaluate.py --checkpoint "$OUT/rl" --baseline-hyp-dir "$OUT/eval_sft/hyps" --baseline-name sft \
  --directions "$DIRECTIONS" --max-sentences "$EVAL_SENTENCES" --max-new-tokens 48 --out "$OUT/eval_rl" \
  > "$OUT/eval_rl.log"

stage 8/8 "summary"
"$PY" tools/quickstart_summary.py "$OUT"
