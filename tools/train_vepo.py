"""VEPO reinforcement learning (or any registered RL loss) on Megatron-Core.

    torchrun --nproc-per-node 2 tools/train_vepo.py --config examples/configs/vepo_tiny.yaml \
        --rl.loss.name grpo --rl.kl.estimator k3
    python tools/train_vepo.py --config examples/configs/vepo_7b.yaml --dry-run   # validate only

Every field of the config tree can be overridden with a dotted flag.
"""

import sys

from vepo_mcore.config import to_dict
from vepo_mcore.config.cli import run_cli
from vepo_mcore.config.job import job_from_cli
from vepo_mcore.rl.losses import get_loss  # registers every loss: --help lists its rl.loss.<name> options


def main(argv: list[str] | None = None) -> None:
    args, cfg = job_from_cli(argv, __doc__)
    if args.dry_run:
        import yaml

        from vepo_mcore.rl.trainer import check_batch_shape, rl_job_config
        from vepo_mcore.training.memory_plan import memory_plan
        from vepo_mcore.training.preflight import report_launch_problems

        cfg = rl_job_config(cfg)
        if args.world_size:
            cfg.parallel.validate(args.world_size)  # TP*PP divides the world before the batch arithmetic
            check_batch_shape(cfg, cfg.parallel.data_parallel_size(args.world_size))
            cfg.validate(args.world_size)
        report_launch_problems(cfg, "rl", strict=args.check_paths)
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        print(f"config OK: {args.config}", file=sys.stderr)
        plan = memory_plan(cfg, args.world_size or cfg.parallel.model_parallel_size, rl=True,
                           critic=get_loss(cfg.rl.loss.name).needs_critic)  # fmt: skip
        print(plan.format())
        plan.check()
        return
    from vepo_mcore.parallel import distributed
    from vepo_mcore.rl.trainer import train_rl

    with distributed(cfg.parallel):
        train_rl(cfg)


if __name__ == "__main__":
    run_cli(main)
