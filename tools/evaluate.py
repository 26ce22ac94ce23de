"""FLORES-200 evaluation over up to 90 directions: BLEU / chrF / chrF++ (+ COMET-22), tables, heatmaps, bootstrap.

  python tools/evaluate.py --hyp-dir hyps/ --out reports/eval/mymodel           # DIR/en-th.txt, ...
  python tools/evaluate.py --system copy-source --directions e2x --max-sentences 100
  python tools/evaluate.py --hyp-dir new/ --baseline-hyp-dir old/ --out cmp/    # + paired bootstrap
  python tools/evaluate.py --hyp-dir hyps/ --eval.spm_model flores200.spm --eval.comet_checkpoint model.ckpt
  python tools/evaluate.py --hf-model ckpt/hf --engine sglang --out reports/eval/vepo   # translate, then score
  python tools/evaluate.py --checkpoint runs/toy/seed0/rl --out reports/eval/rl          # Megatron checkpoint

--hf-model translates greedily with a rollout engine (SGLang on GPU; fake_sglang runs tiny models on
CPU) into OUT/hyps/{src}-{tgt}.txt, resuming finished directions, then scores them like --hyp-dir.
--checkpoint does the same from a Megatron training checkpoint with the embedded engine
(vepo_mcore.eval.generate; its saved config gives the model, --max-new-tokens the length cap).
"""

from __future__ import annotations

import argparse
import sys

from vepo_mcore.config import EvalConfig, JobConfig
from vepo_mcore.config.base import from_dict, load_config, to_dict
from vepo_mcore.eval.runner import EvalJob, SystemSpec, print_summary, run_evaluation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hyp-dir", help="directory of hypothesis files DIR/{src}-{tgt}.txt")
    parser.add_argument(
        "--system", default=None, help="hyp-dir (default with --hyp-dir), reference, copy-source"
    )
    parser.add_argument("--name", help="display name of the system")
    parser.add_argument("--baseline-hyp-dir", help="second system for the paired bootstrap")
    parser.add_argument("--baseline-system", help="baseline as a sanity system: reference, copy-source")
    parser.add_argument("--baseline-name", help="display name of the baseline")
    parser.add_argument("--out", default="reports/eval/run", help="output directory")
    parser.add_argument(
        "--config", help="job YAML (examples/configs/*.yaml): its eval section gives the defaults"
    )
    parser.add_argument("--directions", help="src-tgt pairs and/or groups x2e,e2x,x2x,all (default: all)")
    parser.add_argument("--split", help="FLORES split: dev or devtest (default: devtest)")
    parser.add_argument("--max-sentences", type=int, default=None, help="first N sentences per direction")
    parser.add_argument("--eval.spm_model", dest="spm_model", help="flores200 sentencepiece model -> spBLEU")
    parser.add_argument("--eval.comet_checkpoint", dest="comet_checkpoint", help="COMET-22 model.ckpt path")
    parser.add_argument("--metrics", default="bleu,chrf,chrf++", help="comma list of string metrics")
    parser.add_argument("--bootstrap-samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--workers", type=int, default=0, help="metric processes (0 = all cores, 1 = serial)")
    parser.add_argument("--width", type=int, default=1, help="decimals of BLEU/chrF (sacrebleu --width)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--hf-model", help="Hugging Face Qwen2 directory to translate with --engine first")
    parser.add_argument("--engine", default="sglang", help="--hf-model engine: sglang, fake_sglang")
    parser.add_argument("--tokenizer", help="--hf-model tokenizer directory (default: the model's)")
    parser.add_argument("--checkpoint", help="Megatron training checkpoint to translate with first")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="translation length cap")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per generate call")
    args = parser.parse_args(argv)

    if args.checkpoint:  # translate first, then score the files like --hyp-dir
        from pathlib import Path

        from vepo_mcore.eval.generate import translate_checkpoint
        from vepo_mcore.parallel import init_distributed

        init_distributed()
        args.hyp_dir = args.hyp_dir or str(Path(args.out) / "hyps")
        translate_checkpoint(
            args.checkpoint, args.hyp_dir, args.directions or "all", args.split or "devtest", args.max_sentences,
            args.max_new_tokens, args.batch_size,
        )  # fmt: skip
        args.name = args.name or Path(args.checkpoint).name
        import torch.distributed as dist

        if dist.get_rank() != 0:  # the model-parallel ranks helped translate; scoring is rank 0's
            return None
    kind = args.system or ("hf-model" if args.hf_model else "hyp-dir" if args.hyp_dir else "reference")
    system = SystemSpec(
        kind=kind, hyp_dir=args.hyp_dir, name=args.name, model_path=args.hf_model, engine=args.engine,
        tokenizer_path=args.tokenizer, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
    )  # fmt: skip
    baseline = None
    if args.baseline_hyp_dir or args.baseline_system:
        kind = args.baseline_system or "hyp-dir"
        baseline = SystemSpec(kind=kind, hyp_dir=args.baseline_hyp_dir, name=args.baseline_name)
    base = to_dict(load_config(JobConfig, args.config).eval) if args.config else {}
    flags = {
        "directions": args.directions,
        "split": args.split,
        "max_sentences": args.max_sentences,
        "spm_model": args.spm_model,
        "comet_checkpoint": args.comet_checkpoint,
    }
    cfg = from_dict(EvalConfig, {**base, **{k: v for k, v in flags.items() if v is not None}})
    job = EvalJob(
        eval=cfg,
        system=system,
        baseline=baseline,
        out_dir=args.out,
        metrics=tuple(m for m in args.metrics.split(",") if m),
        bootstrap_samples=args.bootstrap_samples,
        seed=args.seed,
        workers=args.workers,
        width=args.width,
        plots=not args.no_plots,
    )
    print_summary(run_evaluation(job), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
