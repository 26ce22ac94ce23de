"""The paper's ablation grid at toy scale on CPU: 6 algorithms x 3 KL regimes = 18 RL runs, plus
DAPO with and without overlong reward shaping. Entropy and response-length curves of every run go
into one figure and a CSV.

    python tools/run_ablation.py --out reports/ablation --steps 6
    python tools/run_ablation.py --out /tmp/abl --algorithms vepo,grpo --kl none,k3 --steps 3 \
        --init runs/toy/seed0/sft               # start every run from the same SFT checkpoint

Extra --section.field flags apply to every run (e.g. --rl.prompts_per_step 8). Runs keep no
checkpoints; their per-step metrics go to OUT/histories.json.
"""

import argparse
import csv
import json
from pathlib import Path

from vepo_mcore.parallel.launch import run_processes

ALGORITHMS = ("vepo", "ppo", "grpo", "dapo", "rloo", "reinforce_pp")
KL_REGIMES = ("none", "k2", "k3")


def run_grid(rank, world, runs, out):
    """Inside one process: every run in turn (train_rl re-initialises the parallel state)."""
    from vepo_mcore.rl.trainer import train_rl

    results = {}
    for name, cfg in runs:
        results[name] = train_rl(cfg)
        Path(out).write_text(json.dumps(results))  # partial results survive an interrupted grid


def build_runs(args, extra: list[str]):
    from vepo_mcore.config import JobConfig, load_config

    runs = []
    base = [
        "--training.train_iters", str(args.steps), "--training.logging.progress_bar", "false",
        *(["--training.checkpoint.load", args.init] if args.init else []),
    ]  # fmt: skip
    for algorithm in args.algorithms.split(","):
        for kl in args.kl.split(","):
            flags = [*base, "--rl.loss.name", algorithm, "--rl.kl.estimator", kl]
            if algorithm == "dapo":
                flags += ["--rl.filtering.dynamic_sampling", "true"]
            name = f"{algorithm}/kl={kl}"
            runs.append((name, load_config(JobConfig, args.config, [*flags, *extra])))
    if args.overlong and "dapo" in args.algorithms.split(","):
        for buffer in (0, args.overlong_buffer):
            flags = [*base, "--rl.loss.name", "dapo", "--rl.filtering.dynamic_sampling", "true",
                     "--rl.loss.overlong_buffer", str(buffer)]  # fmt: skip
            name = f"dapo-overlong/buffer={buffer}"
            runs.append((name, load_config(JobConfig, args.config, [*flags, *extra])))
    return runs


def write_outputs(results: dict[str, list[dict]], out: Path) -> None:
    from vepo_mcore.rl.curves import plot_curves

    keys = (
        "rollout/entropy",
        "rollout/len_mean",
        "reward/total",
        "reward/mt",
        "rl/kl_k3",
        "rollout/truncated_frac",
    )
    with (out / "ablation.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "step", *keys])
        for name, rows in results.items():
            for row in rows:
                writer.writerow([name, row["step"], *(row.get(k, "") for k in keys)])
    grid = {k: v for k, v in results.items() if not k.startswith("dapo-overlong")}
    panels = (("rollout/entropy", "entropy"), ("rollout/len_mean", "response length (tokens)"),
              ("reward/total", "raw reward"))  # fmt: skip
    plot_curves(grid, out / "ablation_curves.png", panels)
    overlong = {k: v for k, v in results.items() if k.startswith("dapo-overlong")}
    if overlong:
        plot_curves(
            overlong, out / "dapo_overlong.png", panels + (("rollout/truncated_frac", "truncated share"),)
        )
    summary = {name: {k: rows[-1].get(k) for k in keys} for name, rows in results.items() if rows}
    (out / "ablation_final.json").write_text(json.dumps(summary, indent=1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/configs/vepo_tiny.yaml")
    p.add_argument("--out", default="reports/ablation")
    p.add_argument("--steps", type=int, default=6, help="RL steps per run")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--kl", default=",".join(KL_REGIMES))
    p.add_argument("--init", default=None, help="checkpoint every run starts from (default: random init)")
    p.add_argument("--no-overlong", dest="overlong", action="store_false", help="skip the DAPO overlong pair")
    p.add_argument("--overlong-buffer", type=int, default=4, help="DAPO soft overlong buffer (tokens)")
    args, extra = p.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = build_runs(args, extra)
    print(f"ablation: {len(runs)} runs x {args.steps} steps -> {out}")
    run_processes(run_grid, 1, args=(runs, str(out / "histories.json")))
    write_outputs(json.loads((out / "histories.json").read_text()), out)
    print(f"wrote {out / 'ablation.csv'}, {out / 'ablation_curves.png'}")


if __name__ == "__main__":
    main()
