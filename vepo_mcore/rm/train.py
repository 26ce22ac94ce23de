"""Train the reward model on the shared training loop (training/loop.py pretrain).

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

from collections.abc import Sequence

from vepo_mcore.config.job import JobConfig
from vepo_mcore.rm.data import Pair, PairDataset, positive_weights
from vepo_mcore.rm.loss import make_forward_step


def rm_model_provider(cfg: JobConfig):
    """This rank's RM stage; its trunk comes from rm.init_from unless the run resumes its own checkpoint."""
    from vepo_mcore.rm.model import build_reward_model, load_policy_weights
    from vepo_mcore.training.loop import resumes_own_checkpoint

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
    from vepo_mcore.training.loop import pretrain

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
