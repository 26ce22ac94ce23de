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

import json
from dataclasses import asdict
from pathlib import Path

from vepo_mcore.config.cli import run_cli

CURVES = (
    ("train/loss", "loss (train)"),
    ("train/bt_loss", "Bradley-Terry loss"),
    ("train/bce_loss", "category loss"),
    ("train/pair_acc", "pairwise accuracy (train)"),
    ("valid/loss", "loss (held-out devtest pairs)"),
    ("valid/pair_acc", "pairwise accuracy (held-out)"),
)


def main(argv: list[str] | None = None) -> dict:
    import torch.distributed as dist

    from vepo_mcore.config.job import job_from_cli
    from vepo_mcore.languages import LANGS, default_tokenizer_dir
    from vepo_mcore.parallel import init_distributed
    from vepo_mcore.rewards.corruptions import CATEGORIES
    from vepo_mcore.rl.curves import plot_curves
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.evaluate import evaluate_pairs, markdown_report
    from vepo_mcore.rm.model import load_reward_model
    from vepo_mcore.rm.train import train_rm
    from vepo_mcore.tokenizer import load_tokenizer

    args, cfg = job_from_cli(argv, __doc__)
    if args.dry_run:
        cfg.validate(args.world_size)
        print(f"config OK: {args.config}")
        return {}
    r, t = cfg.rm, cfg.training
    if not t.checkpoint.save:
        raise ValueError("training.checkpoint.save must be set: the RM is evaluated and served from it")
    tokenizer_dir = cfg.tokenizer.path or str(default_tokenizer_dir())
    tokenizer = load_tokenizer(tokenizer_dir)
    rank, _ = init_distributed(cfg.parallel.backend, timeout_minutes=cfg.parallel.distributed_timeout_minutes)

    langs, categories = r.langs or LANGS, r.categories or CATEGORIES
    build = dict(
        tgt_langs=langs,
        categories=categories,
        tokenizer=tokenizer,
        other_language=r.other_language_off_target,
    )
    train = build_pairs("dev", lines=range(r.train_lines), seed=r.seed, **build)
    test = build_pairs("devtest", lines=range(r.test_lines), seed=r.seed + 1, **build)
    history = train_rm(cfg, train, tokenizer, valid_pairs=test, tokenizer_dir=tokenizer_dir)

    model = load_reward_model(t.checkpoint.save)[0]  # the saved RM, in this run's TP/PP layout
    result = evaluate_pairs(model, tokenizer, test, t.seq_length, batch_size=2 * t.micro_batch_size)
    summary = {"train_pairs": len(train), "final_train": history[-1] if history else {}, **asdict(result)}
    if rank == 0:
        out = Path(r.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = (
            f"Reward model on FLORES devtest pairs ({len(train)} dev training pairs, {t.train_iters} steps)"
        )
        (out / "eval.md").write_text(markdown_report(result, title))
        (out / "eval.json").write_text(json.dumps(summary, indent=1))
        if history:
            plot_curves(history, out / "curves.png", panels=CURVES, xlabel="step")
        print(markdown_report(result, title))
    if dist.is_initialized():
        dist.barrier()
    return summary


if __name__ == "__main__":
    run_cli(main)
