"""Continued pre-training (data.mode=cpt) or SFT (data.mode=sft) of a Qwen2.5-architecture model.

    python tools/build_cpt_corpus.py --output-dir data/cpt_tiny
    torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/cpt_tiny.yaml
    python tools/build_sft_data.py --output-dir data/sft_tiny
    torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/sft_tiny.yaml \
        --training.checkpoint.load ckpt/cpt_tiny --training.checkpoint.finetune true

The CPT run saves ckpt/cpt_tiny, which the SFT run loads. Every field of the config tree can be
overridden with a dotted flag (--training.train_iters 100); --help lists them, --print-config
prints the effective config. Resumes from training.checkpoint.save when it holds a checkpoint.
Each log interval prints one line on stdout (iteration, consumed samples and tokens, ms per
iteration, tokens/s, TFLOP/s per device, lr, loss, grad norm, skipped and nan steps, peak memory).
"""

import warnings

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

from vepo_mcore.config.cli import run_cli  # noqa: E402
from vepo_mcore.config.job import JobConfig, job_from_cli  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args, cfg = job_from_cli(argv, __doc__)
    if args.dry_run:
        from vepo_mcore.training.memory_plan import memory_plan
        from vepo_mcore.training.preflight import report_launch_problems

        cfg.validate(args.world_size)
        report_launch_problems(cfg, "pretrain", strict=args.check_paths)
        print(dry_run_summary(cfg, args.world_size))
        plan = memory_plan(cfg, args.world_size or cfg.parallel.model_parallel_size)
        print(plan.format())
        plan.check()
        return

    from vepo_mcore.parallel import distributed
    from vepo_mcore.training.trainer import pretrain

    with distributed(cfg.parallel):
        pretrain(cfg)


def dry_run_summary(cfg: JobConfig, world_size: int | None) -> str:
    """The run's shape and token budget, for checking a launch script without GPUs."""
    t, p = cfg.training, cfg.parallel
    tokens = t.global_batch_size * t.seq_length
    lines = [
        f"config OK: mode={cfg.data.mode} TP={p.tensor_model_parallel_size} PP={p.pipeline_model_parallel_size}",
        f"tokens/step {tokens:,} x {t.train_iters:,} steps = {tokens * t.train_iters / 1e9:,.1f}B tokens",
    ]
    if world_size:
        dp = p.data_parallel_size(world_size)
        accumulation = t.global_batch_size // (t.micro_batch_size * dp)
        lines.append(f"world {world_size} -> DP={dp}, gradient accumulation {accumulation}")
    return "\n".join(lines)


if __name__ == "__main__":
    run_cli(main)
