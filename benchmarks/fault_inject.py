"""Kill -9 the CPT, SFT and RL trainers N times in a row and show every run still ends bit-identical.

    .venv/bin/python benchmarks/fault_inject.py [--kills 20] [--nproc 2] [--trainers cpt sft rl]

For each trainer (the real tools, tiny configs, gloo on CPU): an uninterrupted reference run, raced
by a second launch on its folder (which must be refused, naming the holder); then a run killed with
SIGKILL at --kills random points (about 40% aimed at a checkpoint being written) and relaunched
each time; then --damage times a random file of its newest checkpoint is truncated, emptied or
deleted and the relaunch must name it and fall back. Compares the final metrics.jsonl (each step
once, every value equal) and the final checkpoint (model, optimizer, python/numpy/torch/tracker
RNG states) with the reference, bit for bit. Prints every event and, after each trainer, the table
so far (also written to <workdir>/table.md).
tests/faults runs the same harness (harness/faults.py) at CI size.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.faults import (  # noqa: E402
    FaultReport,
    build_data,
    compare_runs,
    cpt_spec,
    damage_and_resume,
    kill_and_resume,
    rl_spec,
    second_writer,
    sft_spec,
    table,
)

SPECS = {"cpt": cpt_spec, "sft": sft_spec, "rl": rl_spec}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=20, help="kills per trainer")
    p.add_argument("--damage", type=int, default=3, help="damaged-checkpoint relaunches per trainer")
    p.add_argument("--nproc", type=int, default=2, help="ranks per launch (gloo)")
    p.add_argument("--trainers", nargs="+", choices=sorted(SPECS), default=["cpt", "sft", "rl"])
    p.add_argument("--iters", type=int, default=None, help="training steps (default: cpt/sft 40, rl 24)")
    p.add_argument("--save-interval", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=Path("runs/fault_inject"))
    args = p.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir.resolve()
    build_data(workdir)
    rng = random.Random(args.seed)
    reports: list[FaultReport] = []
    for name in args.trainers:
        iters = args.iters or (24 if name == "rl" else 40)
        spec = SPECS[name](workdir, nproc=args.nproc, train_iters=iters, save_interval=args.save_interval)
        straight, faulty = workdir / f"{name}_straight", workdir / f"{name}_faulty"
        for folder in (straight, faulty):
            if folder.exists():
                sys.exit(f"{folder} exists: give a fresh --workdir")
        start = time.perf_counter()
        report = FaultReport(name)
        second_writer(spec, straight, report)
        killed = kill_and_resume(spec, faulty, args.kills, rng)
        report.kills, report.saves_interrupted = killed.kills, killed.saves_interrupted
        report.resumes, report.checkpoints_lost = killed.resumes, killed.checkpoints_lost
        report.events += killed.events
        compare_runs(straight, faulty, report, iters)
        identical = [report.curves_identical, report.checkpoint_identical]
        for _ in range(args.damage):
            damage_and_resume(spec, faulty, rng, report)
            compare_runs(straight, faulty, report, iters)
            identical += [report.curves_identical, report.checkpoint_identical]
        report.curves_identical = all(identical[0::2])
        report.checkpoint_identical = all(identical[1::2])
        reports.append(report)
        print(
            f"== {name}: {time.perf_counter() - start:.0f} s, {iters} steps, nproc {args.nproc}", flush=True
        )
        for event in report.events:
            print(f"  {event}", flush=True)
        text = table(reports)  # after each trainer: a run cut short still leaves its rows
        (workdir / "table.md").write_text(text + "\n")
        print(text, flush=True)


if __name__ == "__main__":
    main()
