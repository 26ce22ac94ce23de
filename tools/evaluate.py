"""FLORES-200 evaluation over up to 90 directions: BLEU / chrF / chrF++ (+ COMET-22), tables, heatmaps, bootstrap.

  python tools/evaluate.py --eval.system.hyp_dir hyps/ --eval.out_dir reports/eval/mymodel   # DIR/en-th.txt, ...
  python tools/evaluate.py --eval.system.kind copy-source --eval.directions e2x --eval.max_sentences 100
  python tools/evaluate.py --eval.system.hyp_dir new/ --eval.baseline.hyp_dir old/ --eval.out_dir cmp/  # + bootstrap
  python tools/evaluate.py --eval.system.hyp_dir hyps/ --eval.spm_model flores200.spm --eval.comet_checkpoint model.ckpt
  python tools/evaluate.py --eval.system.model_path ckpt/hf --eval.out_dir reports/eval/vepo   # SGLang translates first
  python tools/evaluate.py --eval.system.checkpoint runs/toy/seed0/rl --eval.out_dir reports/eval/rl  # Megatron checkpoint
  python tools/evaluate.py --config job.yaml --dry-run      # the job YAML's eval: section gives the defaults

Every field of the eval section (vepo_mcore/config/eval.py) is a dotted flag (--help lists them).
An hf-model system translates greedily with a rollout engine (eval.system.engine, SGLang on GPU)
into OUT/hyps/{src}-{tgt}.txt, resuming finished directions, then is scored like a hyp-dir; a
checkpoint system does the same from a Megatron training checkpoint with the engine its saved config
names (vepo_mcore.eval.translate_checkpoint; eval.system.max_new_tokens caps the length).
"""

import sys

from vepo_mcore.config import to_dict
from vepo_mcore.config.cli import run_cli
from vepo_mcore.config.job import job_from_cli


def main(argv: list[str] | None = None) -> int:
    args, cfg = job_from_cli(argv, __doc__, sections=("eval",))
    if args.dry_run:
        import yaml

        print(yaml.safe_dump({"eval": to_dict(cfg.eval)}, sort_keys=False))
        print(f"config OK: {args.config}", file=sys.stderr)
        return 0
    from vepo_mcore.eval.runner import evaluate_config

    evaluate_config(cfg.eval)
    return 0


if __name__ == "__main__":
    run_cli(main)
