"""VEPO reinforcement learning (or any registered RL loss) on Megatron-Core.

    torchrun --nproc-per-node 2 tools/train_vepo.py --config examples/configs/vepo_tiny.yaml \
        --rl.loss.name grpo --rl.kl.estimator k3
    python tools/train_vepo.py --config examples/configs/vepo_7b.yaml --dry-run   # validate only

Every field of the config tree can be overridden with a dotted flag.
"""

import argparse
import sys

from vepo_mcore.config import JobConfig, load_config, to_dict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML config (see examples/configs/)")
    parser.add_argument("--dry-run", action="store_true", help="parse and validate the config, then exit")
    parser.add_argument("--world-size", type=int, default=None, help="--dry-run: also check this many ranks")
    args, overrides = parser.parse_known_args(argv)
    cfg = load_config(JobConfig, args.config, overrides)
    if args.dry_run:
        import yaml

        from vepo_mcore.rl.trainer import check_batch_shape, rl_job_config

        if args.world_size:
            cfg = rl_job_config(cfg)
            check_batch_shape(cfg, cfg.parallel.data_parallel_size(args.world_size))
            cfg.validate(args.world_size)

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        print(f"config OK: {args.config}", file=sys.stderr)
        return
    from vepo_mcore.parallel import init_distributed
    from vepo_mcore.rl.trainer import train_rl

    init_distributed(cfg.parallel.backend, timeout_minutes=cfg.parallel.distributed_timeout_minutes)
    train_rl(cfg)


if __name__ == "__main__":
    main()
