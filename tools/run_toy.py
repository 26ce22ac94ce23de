"""The toy recipe that learns: the paper's whole chain on 2 CPU cores, nothing downloaded.

    python tools/run_toy.py --seeds 0 1 2                   # runs/toy, then reports/toy
    python tools/run_toy.py --seeds 0 --out runs/toy_fast --iters sft=200 rl=40 --report-dir /tmp/r

Expanded tokenizer -> trimmed vocabulary -> base -> embedding resize -> CPT (1:1) -> SFT -> VEPO RL
-> held-out evaluation on FLORES devtest -> reports/toy/{summary.json,results.md,rl_curves.png,
seed*_constraints_{sft,rl}.md}. Configs: examples/configs/toy/*.yaml (the stages are the 7B
recipe's entry scripts). Rerunning continues an interrupted run (finished stages are skipped).
--set STAGE.FIELD=VALUE passes a dotted override to one stage (--set rl.rl.kl.estimator=k3), or
to every training stage with STAGE "all" (--set all.model.num_layers=2).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep:
            raise SystemExit(f"{flag} {value!r}: expected NAME=VALUE")
        out[key] = rest
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/toy", help="run directory (shared/ and seed<N>/)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--directions", default="en-th,en-vi,th-en,vi-en")
    p.add_argument(
        "--iters", nargs="*", action="extend", default=[], metavar="STAGE=N", help="train_iters per stage"
    )
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="STAGE.FIELD=VALUE",
        help="per-stage overrides",
    )
    p.add_argument("--eval-sentences", type=int, default=50, help="devtest sentences per direction")
    p.add_argument("--max-new-tokens", type=int, default=96, help="evaluation length cap")
    p.add_argument("--rl-holdout", type=int, default=197, metavar="N",
                   help="the last N dev sentences are RL prompts only, never SFT data (0: RL on the SFT sentences)")  # fmt: skip
    p.add_argument("--nproc", type=int, default=1, help="training processes")
    p.add_argument("--threads", type=int, default=2, help="threads per process")
    p.add_argument("--report-dir", default="reports/toy", help="where summary.json and results.md go")
    p.add_argument("--no-report", action="store_true", help="run the stages only")
    args = p.parse_args(argv)

    from vepo_mcore.toy.recipe import ToyPlan, run_toy

    iters = {stage: int(n) for stage, n in _pairs(args.iters, "--iters").items()}
    overrides: dict[str, list[str]] = {}
    for key, value in _pairs(args.set, "--set").items():
        stage, _, field = key.partition(".")
        overrides.setdefault(stage, []).extend([f"--{field}", value])
    plan = ToyPlan(out=Path(args.out), seeds=args.seeds, directions=args.directions, nproc=args.nproc,
                   threads=args.threads, iters=iters, overrides=overrides, eval_sentences=args.eval_sentences,
                   max_new_tokens=args.max_new_tokens, rl_holdout=args.rl_holdout)  # fmt: skip
    seed_dirs = run_toy(plan)
    if args.no_report:
        return 0
    from vepo_mcore.toy.report import write_report

    summary = write_report(seed_dirs, plan.out / "shared", args.report_dir)
    print(
        json.dumps({k: summary[k] for k in ("seeds", "wall_s_one_seed", "sft", "rl", "delta_ci95")}, indent=1)
    )
    print(f"report: {args.report_dir}/results.md, {args.report_dir}/rl_curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
