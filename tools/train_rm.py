"""Train the translation reward model on corrupted-FLORES pairs and evaluate it on devtest.

    python tools/train_rm.py --config examples/configs/rm_tiny.yaml [--rm.init_from ckpt/sft]
    torchrun --nproc-per-node 8 tools/train_rm.py --config examples/configs/rm_7b.yaml

Everything comes from the config (the `rm` section: languages, categories, FLORES lines, loss
weights, the policy to start from; `training`: batch sizes in pairs, steps, checkpoints) plus
dotted overrides. Training pairs come from FLORES dev, the held-out pairs from devtest (validation
loss every training.eval_interval and the final tables). A relaunch resumes from
training.checkpoint.save. Writes <rm.report_dir>/eval.md (pairwise accuracy per category and
language, detection P/R/F1), eval.json and curves.png; the RM checkpoint serves
rl.rewards.mt = 'rm' through rl.rewards.rm_checkpoint.
"""

from __future__ import annotations

from vepo_mcore.config.cli import run_cli


def main(argv: list[str] | None = None) -> dict:
    from vepo_mcore.config.job import job_from_cli
    from vepo_mcore.parallel import distributed
    from vepo_mcore.rm.train import train_and_report

    args, cfg = job_from_cli(argv, __doc__)
    if args.dry_run:
        from vepo_mcore.training.preflight import report_launch_problems

        cfg.validate(args.world_size)
        report_launch_problems(cfg, "rm", strict=args.check_paths)
        print(f"config OK: {args.config}")
        return {}
    if not cfg.training.checkpoint.save:
        raise ValueError("training.checkpoint.save must be set: the RM is evaluated and served from it")
    with distributed(cfg.parallel):
        return train_and_report(cfg)


if __name__ == "__main__":
    run_cli(main)
