"""Train the reward model on the shared training loop (training/trainer.py pretrain).

    history = train_rm(cfg, train_pairs, tokenizer, valid_pairs=test_pairs, tokenizer_dir=tok_dir)

The loop is the CPT/SFT one: megatron's schedule at any TP/PP/DP, atomic checkpoints every
training.checkpoint.save_interval, exact resume from training.checkpoint.save (the data position
is part of the checkpoint), tokens/s and ETA logs, validation on `valid_pairs` every
training.eval_interval. Only the model (rm.model: GPTModel + an 11-wide head, its trunk from
rm.init_from on a fresh start), the data (rm.data.PairDataset) and the loss (rm.loss) differ.
Batch sizes count pairs. The checkpoint carries config.yaml and the tokenizer, which
rm.model.load_reward_model reads back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from vepo_mcore.config.job import JobConfig
from vepo_mcore.languages import LANGS, default_tokenizer_dir
from vepo_mcore.rewards.corruptions import CATEGORIES
from vepo_mcore.rm.data import Pair, PairDataset, build_pairs, positive_weights
from vepo_mcore.rm.evaluate import evaluate_pairs, markdown_report
from vepo_mcore.rm.loss import make_forward_step
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.curves import plot_curves
from vepo_mcore.training.trainer import pretrain, resumes_own_checkpoint

# Imported where used: vepo_mcore.rm.model (pulls megatron.core; lock order: importing this module must load
# no megatron, so that a run can take the save folder's lock first and refuse a second launch in seconds).


def rm_model_provider(cfg: JobConfig):
    """This rank's RM stage; its trunk comes from rm.init_from unless the run resumes its own checkpoint."""
    from vepo_mcore.rm.model import build_reward_model, load_policy_weights

    model = build_reward_model(cfg)
    if cfg.rm.init_from and not resumes_own_checkpoint(cfg):
        load_policy_weights(model, cfg.rm.init_from)
    return model


def train_rm(
    cfg: JobConfig,
    pairs: Sequence[Pair],
    tokenizer,
    *,
    valid_pairs: Sequence[Pair] | None = None,
    tokenizer_dir: str | None = None,
) -> list[dict[str, float]]:
    """Collective: train (or resume) the RM to training.train_iters on `pairs`; per-step metrics.

    Category positives are weighted negatives / positives (rm.balance_categories) as counted in
    `pairs`, so a resumed run weights them exactly as the first did.
    """
    if not pairs:
        raise ValueError("train_rm: no training pairs")
    t = cfg.training
    weights = positive_weights(pairs, cfg.rm.max_pos_weight) if cfg.rm.balance_categories else None
    train = PairDataset(pairs, tokenizer, t.seq_length, seed=t.seed)
    valid = PairDataset(valid_pairs, tokenizer, t.seq_length, seed=t.seed) if valid_pairs else None
    return pretrain(
        cfg,
        train,
        valid,
        forward_step_func=make_forward_step(cfg.rm.bce_weight, weights),
        tokenizer_dir=tokenizer_dir,
        model_provider=rm_model_provider,
    )


CURVES = (
    ("train/loss", "loss (train)"),
    ("train/bt_loss", "Bradley-Terry loss"),
    ("train/bce_loss", "category loss"),
    ("train/pair_acc", "pairwise accuracy (train)"),
    ("valid/loss", "loss (held-out devtest pairs)"),
    ("valid/pair_acc", "pairwise accuracy (held-out)"),
)
"""The panels of <rm.report_dir>/curves.png."""


def train_and_report(cfg: JobConfig) -> dict:
    """Collective: pairs from FLORES dev (training) and devtest (held out), train_rm, then the saved RM
    evaluated on the held-out pairs; rank 0 writes <rm.report_dir>/eval.md, eval.json, curves.png.
    Returns the summary written to eval.json."""
    from vepo_mcore.rm.model import load_reward_model

    r, t = cfg.rm, cfg.training
    if not t.checkpoint.save:
        raise ValueError("training.checkpoint.save must be set: the RM is evaluated and served from it")
    tokenizer_dir = cfg.tokenizer.path or str(default_tokenizer_dir())
    tokenizer = load_tokenizer(tokenizer_dir)
    build = dict(tgt_langs=r.langs or LANGS, categories=r.categories or CATEGORIES, tokenizer=tokenizer,
                 other_language=r.other_language_off_target)  # fmt: skip
    train = build_pairs("dev", lines=range(r.train_lines), seed=r.seed, **build)
    test = build_pairs("devtest", lines=range(r.test_lines), seed=r.seed + 1, **build)
    history = train_rm(cfg, train, tokenizer, valid_pairs=test, tokenizer_dir=tokenizer_dir)

    model = load_reward_model(t.checkpoint.save)[0]  # the saved RM, in this run's TP/PP layout
    result = evaluate_pairs(model, tokenizer, test, t.seq_length, batch_size=2 * t.micro_batch_size)
    summary = {"train_pairs": len(train), "final_train": history[-1] if history else {}, **asdict(result)}
    if dist.get_rank() == 0:
        out = Path(r.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = (
            f"Reward model on FLORES devtest pairs ({len(train)} dev training pairs, {t.train_iters} steps)"
        )
        (out / "eval.md").write_text(markdown_report(result, title))
        (out / "eval.json").write_text(json.dumps(summary, indent=1))
        if history:
            plot_curves(history, out / "curves.png", panels=CURVES, xlabel="step", smooth=0.95)
        print(markdown_report(result, title))
    dist.barrier()
    return summary
