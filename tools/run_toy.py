"""The toy recipe (recipes/toy): the paper's whole chain on 2 CPU cores, nothing from a model hub.

    python tools/run_toy.py --seeds 0 1 2                   # runs/toy, then reports/toy
    python tools/run_toy.py --seeds 0 --out runs/toy_fast --iters sft=200 rl=40 --report-dir /tmp/r
    python tools/run_toy.py --seeds 0 --until sft --iters sft=2500   # what tools/run_grid.py starts from

Parallel text from Debian packages (apt-get; --no-bitext: FLORES dev only) -> tokenizer -> base ->
resize -> CPT -> SFT -> VEPO RL -> held-out evaluation -> reports/toy. A rerun continues (finished
stages are skipped). --set STAGE.FIELD=VALUE overrides one stage's field (STAGE "all": every one).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from vepo_mcore.config.cli import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/ lives in the checkout, beside tools/

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--out", default="runs/toy", help="run directory (shared/ and seed<N>/)")
    add("--seeds", type=int, nargs="+", default=[0])
    add("--directions", default="en-th,en-vi,en-id,th-en,vi-en,id-en")
    add("--no-bitext", action="store_true", help="FLORES dev only: no parallel text from packages")
    add("--bitext-cache", default="~/.cache/vepo_mcore/debs", help="the fetched .deb files (reused)")
    add("--iters", nargs="*", action="extend", default=[], metavar="STAGE=N", help="train_iters per stage")
    add("--set", nargs="*", action="extend", default=[], metavar="STAGE.FIELD=VALUE", help="stage overrides")
    add("--name-swap", type=float, default=0.0, metavar="SHARE", help="SFT share of name-swapped pairs")
    add("--vocab-min-count", type=int, default=10, metavar="K",
        help="the toy vocabularies keep ids used >= K times in their data (1: every id)")  # fmt: skip
    add("--eval-sentences", type=int, default=100,
        help="devtest sentences per direction (the report compares on the first 50)")  # fmt: skip
    add("--max-new-tokens", type=int, default=96, help="evaluation length cap")
    add("--rl-holdout", type=int, default=197, metavar="N",
        help="the last N dev sentences are RL prompts only, never SFT data (0: RL on the SFT sentences)")  # fmt: skip
    add("--sft-window", type=int, default=2, metavar="K",
        help="SFT also trains on runs of 2..K consecutive dev sentences, joined (1: single sentences)")  # fmt: skip
    add("--rl-validation", type=int, default=50, metavar="N",
        help="the last N RL dev sentences validate RL every --rl-eval-interval steps and the checkpoint with the "
             "best validation overall + chrF++ is evaluated (0: RL on all of them, the last checkpoint)")  # fmt: skip
    add("--rl-eval-interval", type=int, default=40, metavar="STEPS", help="RL steps between validations")
    add("--nproc", type=int, default=1, help="training processes")
    add("--threads", type=int, default=2, help="threads per process")
    add("--report-dir", default="reports/toy", help="where summary.json and results.md go")
    add("--no-report", action="store_true", help="run the stages only")
    add("--until", choices=("resize", "cpt", "sft", "rl"), default="rl", help="a seed's last training stage")
    args = p.parse_args(argv)

    from recipes.toy.recipe import ToyPlan, run_toy, stage_flags

    iters, overrides = stage_flags(args.iters, args.set)
    plan = ToyPlan(out=Path(args.out), seeds=args.seeds, directions=args.directions, nproc=args.nproc,
                   threads=args.threads, iters=iters, overrides=overrides, eval_sentences=args.eval_sentences,
                   max_new_tokens=args.max_new_tokens, rl_holdout=args.rl_holdout, sft_window=args.sft_window,
                   rl_validation=args.rl_validation, rl_eval_interval=args.rl_eval_interval,
                   bitext=not args.no_bitext, bitext_cache=Path(args.bitext_cache).expanduser(),
                   name_swap=args.name_swap, vocab_min_count=args.vocab_min_count, until=args.until)  # fmt: skip
    seed_dirs = run_toy(plan)
    if not args.no_report and args.until == "rl":
        from recipes.toy.report import write_report

        summary = write_report(seed_dirs, plan.out / "shared", args.report_dir)
        keys = ("seeds", "wall_s_one_seed", "sft", "rl", "delta_ci95")
        print(json.dumps({k: summary[k] for k in keys}, indent=1))
        print(f"report: {args.report_dir}/results.md, {args.report_dir}/rl_curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
