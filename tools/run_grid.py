"""The paper's RL experiments at toy scale from the toy's SFT checkpoint (recipes/toy/grid.py): 6
algorithms x KL {none, k3}, VEPO and GRPO on 3 seeds, DAPO with the overlong penalty, REINFORCE++
with a per-prompt baseline, VEPO with each part removed (and with the group std and k3, the KL arm);
each run validated, its best checkpoint scored on FLORES devtest; then the figures, grid.json and a
verdict per claim and ablation (claims.json, grid.md).

    python tools/run_grid.py                  # runs/toy/seed0 -> reports/toy/grid_runs -> reports/toy
    python tools/run_grid.py --steps 4 --seeds 0 --algorithms vepo --kl none --ablations none --out /tmp/g
    python tools/run_grid.py --report-only    # redraw from finished runs (a rerun skips finished runs)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vepo_mcore.config.cli import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/ lives in the checkout, beside tools/


def main(argv: list[str] | None = None) -> int:
    from recipes.toy.grid import (
        ABLATIONS,
        ALGORITHMS,
        KL_REGIMES,
        GridSetup,
        plan_grid,
        report_plan,
        set_flags,
        timed_grid,
    )
    from recipes.toy.grid_report import write_grid_report

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--toy", default="runs/toy/seed0", help="toy seed directory holding sft/ (tools/run_toy.py)")
    add("--out", default="reports/toy/grid_runs", help="a folder per run (committed: a clone continues)")
    add("--report-dir", default="reports/toy")
    add("--steps", type=int, default=200, help="RL steps per run")
    add("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of VEPO, GRPO and the ablations")
    add("--algorithms", default=",".join(ALGORITHMS))
    add("--kl", default=",".join(KL_REGIMES), help="KL regimes (none, k1, k2, k3)")
    add("--ablations", default=",".join(ABLATIONS), help="VEPO parts removed one at a time, or 'none'")
    add("--temperature", type=float, help="sampling and loss tau (default: the toy recipe's)")
    add("--kl-coef", type=float, default=0.05)
    add("--lr", type=float, help="constant learning rate of every run (default: the toy recipe's)")
    add("--mini-batches", type=int, default=4, help="optimizer updates per rollout batch and epoch")
    add("--ppo-epochs", type=int, default=1, help="passes over each rollout batch")
    add("--micro-batch-size", type=int, default=8, help="responses per micro-batch")
    add("--num-candidates", type=int, default=8, help="K candidates per prompt before RLVR filtering")
    add("--group-size", type=int, default=4, help="G responses kept per prompt")
    add("--eval-interval", type=int, default=40, help="RL steps between validations and checkpoints")
    add("--heldout-sentences", type=int, default=150, help="devtest sentences per direction")
    add("--workers", type=int, default=2, help="runs at a time")
    add("--threads", type=int, default=1, help="threads per run")
    add("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override for every run")
    add("--report-only", action="store_true", help="no training: report on finished runs")
    args = p.parse_args(argv)

    names = ("kl_coef", "mini_batches", "ppo_epochs", "micro_batch_size", "num_candidates", "group_size",
             "eval_interval", "heldout_sentences", "temperature", "lr")  # fmt: skip
    settings = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    setup = GridSetup.from_toy(args.toy, **settings, extra=tuple(set_flags(args.set)))
    ablations = [] if args.ablations == "none" else args.ablations.split(",")
    runs = plan_grid(args.algorithms.split(","), args.kl.split(","), args.seeds, ablations=ablations)
    wall_s = timed_grid(runs, setup, args.out, args.steps, args.workers, args.threads, args.report_only)
    claims = write_grid_report(report_plan(runs), args.out, args.report_dir, setup, wall_s, steps=args.steps)
    for name, claim in claims.items():
        print(f"{name}: {claim['verdict']}")
    print(f"wrote {args.report_dir}/grid.json, claims.json, grid.md and grid_*.png")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
