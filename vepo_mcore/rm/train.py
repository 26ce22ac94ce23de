"""Train the reward model with the shared training step (training/loop.py train_step).

    history, model = train_rm(cfg, train_pairs, tokenizer, init_from="ckpt/policy")

Batch sizes count pairs: training.micro_batch_size pairs (2x sequences) per micro-batch and
training.global_batch_size pairs per optimizer step; training.seq_length caps each sequence.
Checkpoints go to training.checkpoint.save (with config.yaml and the tokenizer, which
rm.model.load_reward_model reads back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.distributed as dist

from vepo_mcore.config.job import JobConfig
from vepo_mcore.rm.data import Pair, PairDataset, micro_batches
from vepo_mcore.rm.loss import make_forward_step


def train_rm(
    cfg: JobConfig,
    pairs: Sequence[Pair],
    tokenizer,
    *,
    bce_weight: float = 1.0,
    init_from: str | None = None,
    tokenizer_dir: str | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
):
    """Collective: build (and optionally initialise from a policy checkpoint) the RM, train
    training.train_iters steps on `pairs`, save if training.checkpoint.save is set.

    Returns (per-step metrics, the DDP-wrapped model).
    """
    from megatron.core import parallel_state as ps

    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm.model import build_reward_model, load_policy_weights
    from vepo_mcore.training.checkpointing import save_checkpoint
    from vepo_mcore.training.loop import num_microbatches, train_step
    from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, wrap_model

    t = cfg.training
    if not pairs:
        raise ValueError("train_rm: no training pairs")
    init_model_parallel(cfg.parallel, seed=t.seed)
    cfg.validate(dist.get_world_size())
    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    n_micro = num_microbatches(cfg, dp_size)

    model = build_reward_model(cfg)
    if init_from:
        load_policy_weights(model, init_from)
    model = wrap_model(model, cfg)
    optimizer = build_optimizer(model, cfg)  # after loading: fp32 master copies start from the policy
    scheduler = build_scheduler(optimizer, cfg)
    data = micro_batches(
        PairDataset(pairs, tokenizer, t.seq_length), t.micro_batch_size, dp_rank, dp_size, t.seed
    )
    forward_step = make_forward_step(bce_weight)
    history = []
    for step in range(1, t.train_iters + 1):
        # Each micro-batch holds 2 * micro_batch_size sequences (better rows, then worse rows).
        metrics = train_step(
            forward_step, data, model, optimizer, scheduler, n_micro, t.seq_length, 2 * t.micro_batch_size
        )
        history.append({"step": step, **metrics})
        if on_step is not None:
            on_step(step, metrics)
    if t.checkpoint.save:
        save_checkpoint(
            t.checkpoint.save, t.train_iters, model, None, None, config=cfg, tokenizer_dir=tokenizer_dir
        )
    return history, model
