"""The paper's RL experiments at toy scale, from the toy recipe's SFT checkpoint: 6 algorithms x KL
{none, k3}, VEPO and GRPO on 3 seeds, DAPO with and without the overlong penalty, and VEPO with
each of its parts removed (recipes/toy/grid.py ABLATIONS) on every seed; each run validated, its
best checkpoint scored on FLORES devtest; then the figures, grid.json and a verdict on each claim
and ablation (claims.json, grid.md).

    python tools/run_grid.py                                # runs/toy/seed0 -> reports/toy/grid_runs -> reports/toy
    python tools/run_grid.py --steps 4 --seeds 0 --algorithms vepo,grpo --kl none --ablations none \\
        --eval-interval 2 --heldout-sentences 4 --out /tmp/g --report-dir /tmp/gr   # a smoke run
    python tools/run_grid.py --report-only                  # redraw from finished runs

Rerunning continues the grid (finished runs are skipped). --set FIELD=VALUE passes a dotted
override to every run (--set rl.prompts_per_step=4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/ lives in the checkout, beside tools/


def main(argv: list[str] | None = None) -> int:
    from recipes.toy.grid import ABLATIONS, ALGORITHMS, KL_REGIMES, GridSetup, plan_grid, run_grid
    from recipes.toy.grid_report import write_grid_report

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--toy", default="runs/toy/seed0", help="toy seed directory holding sft/ (tools/run_toy.py)"
    )
    p.add_argument(
        "--out",
        default="reports/toy/grid_runs",
        help="one folder per run (their metrics are committed, so a fresh clone continues the grid)",
    )
    p.add_argument("--report-dir", default="reports/toy")
    p.add_argument("--steps", type=int, default=200, help="RL steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="seeds of the VEPO and GRPO cells and of the ablations")  # fmt: skip
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--kl", default=",".join(KL_REGIMES), help="KL regimes (none, k1, k2, k3)")
    p.add_argument(
        "--ablations", default=",".join(ABLATIONS), help="VEPO parts removed one at a time, or 'none'"
    )
    p.add_argument("--temperature", type=float, help="sampling and loss tau (default: the toy recipe's)")
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--lr", type=float, help="constant learning rate of every run (default: the toy recipe's)")
    p.add_argument(
        "--mini-batches", type=int, default=4, help="optimizer updates per rollout batch and epoch"
    )
    p.add_argument("--ppo-epochs", type=int, default=1, help="passes over each rollout batch")
    p.add_argument("--micro-batch-size", type=int, default=8, help="responses per micro-batch")
    p.add_argument(
        "--num-candidates", type=int, default=8, help="K candidates per prompt before RLVR filtering"
    )
    p.add_argument("--group-size", type=int, default=4, help="G responses kept per prompt")
    p.add_argument(
        "--eval-interval", type=int, default=40, help="RL steps between validations and checkpoints"
    )
    p.add_argument("--heldout-sentences", type=int, default=150, help="devtest sentences per direction")
    p.add_argument("--workers", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="threads per run")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override for every run")
    p.add_argument("--report-only", action="store_true", help="no training: report on finished runs")
    args = p.parse_args(argv)

    extra = []
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected FIELD=VALUE")
        extra += [f"--{field}", value]
    settings = dict(kl_coef=args.kl_coef, mini_batches=args.mini_batches, ppo_epochs=args.ppo_epochs,
                    micro_batch_size=args.micro_batch_size, num_candidates=args.num_candidates,
                    group_size=args.group_size, eval_interval=args.eval_interval,
                    heldout_sentences=args.heldout_sentences, extra=tuple(extra))  # fmt: skip
    if args.temperature is not None:
        settings["temperature"] = args.temperature
    if args.lr is not None:
        settings["lr"] = args.lr
    setup = GridSetup.from_toy(args.toy, **settings)
    ablations = [] if args.ablations == "none" else args.ablations.split(",")
    runs = plan_grid(args.algorithms.split(","), args.kl.split(","), args.seeds, ablations=ablations)
    wall_file = Path(args.out) / "wall_s.json"
    if not args.report_only:
        wall = run_grid(runs, setup, args.out, args.steps, args.workers, args.threads)
        previous = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else 0.0
        wall_file.write_text(json.dumps({"wall_s": previous + wall, "workers": args.workers,
                                         "threads": args.threads}))  # fmt: skip
    wall_s = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else None
    claims = write_grid_report(runs, args.out, args.report_dir, setup, wall_s)
    for name, claim in claims.items():
        print(f"{name}: {claim['verdict']}")
    print(f"wrote {args.report_dir}/grid.json, claims.json, grid.md and grid_*.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
