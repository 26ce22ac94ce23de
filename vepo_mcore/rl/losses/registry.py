"""The loss registry: `@register_loss("name", advantages=fn, kl_placement="loss")`.

A loss is `loss_fn(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> (loss, metrics)`.
Its advantage function `advantages_fn(batch, cfg, kl) -> [B, T]` is registered beside it so the
trainer can compute advantages once on the whole global batch (set RLBatch.advantages) before
splitting it into micro-batches; a loss given a batch without advantages computes them itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.batch import RLBatch

LossFn = Callable[..., tuple[torch.Tensor, dict]]
AdvantageFn = Callable[[RLBatch, LossConfig, "KLConfig | None"], torch.Tensor]


@dataclass(frozen=True)
class LossSpec:
    """A registered algorithm: its loss, its advantage estimator, where its KL goes by default."""

    name: str
    loss_fn: LossFn
    advantages_fn: AdvantageFn
    kl_placement: str


LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str, advantages: AdvantageFn, kl_placement: str = "loss"
) -> Callable[[LossFn], LossFn]:
    if kl_placement not in ("loss", "reward"):
        raise ValueError(f"kl_placement must be 'loss' or 'reward', got {kl_placement!r}")

    def wrap(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = LossSpec(name, fn, advantages, kl_placement)
        return fn

    return wrap


def get_loss(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ValueError(f"unknown rl.loss.name {name!r}; known: {sorted(LOSSES)}")
    return LOSSES[name]


def compute_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    """Run the loss named by cfg.name."""
    return get_loss(cfg.name).loss_fn(batch, cfg, kl)


def compute_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    """The advantages cfg.name would use for `batch` (call it on the global batch), [B, T]."""
    return get_loss(cfg.name).advantages_fn(batch, cfg, kl)
