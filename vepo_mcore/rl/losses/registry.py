"""The loss registry: `@register_loss("name", advantages=fn)`.

A loss is `loss_fn(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> (loss, metrics)`.
Its advantage function `advantages_fn(batch, cfg, kl) -> [B, T]` is registered beside it so the
trainer can compute advantages once on the whole global batch (set RLBatch.advantages) before
splitting it into micro-batches; a loss given a batch without advantages computes them itself.
Likewise an optional `keep_fn(batch, cfg, kl) -> [B] bool | None` (DAPO's dynamic sampling) decides
on the whole batch which responses the loss trains on (RLBatch.keep): a group split over
micro-batches is never whole inside one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.batch import RLBatch

LossFn = Callable[..., tuple[torch.Tensor, dict]]
AdvantageFn = Callable[[RLBatch, LossConfig, "KLConfig | None"], torch.Tensor]
KeepFn = Callable[[RLBatch, LossConfig, "KLConfig | None"], "torch.Tensor | None"]


@dataclass(frozen=True)
class LossSpec:
    """A registered algorithm: its loss, its advantage estimator, which responses it keeps, and
    whether it trains a value model beside the policy (the trainer builds one only then)."""

    name: str
    loss_fn: LossFn
    advantages_fn: AdvantageFn
    keep_fn: KeepFn | None = None
    needs_critic: bool = False


LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str, advantages: AdvantageFn, keep: KeepFn | None = None, needs_critic: bool = False
) -> Callable[[LossFn], LossFn]:

    def wrap(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered by {LOSSES[name].loss_fn.__module__}")
        LOSSES[name] = LossSpec(name, fn, advantages, keep, needs_critic)
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


def compute_keep(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor | None:
    """[B] bool: the responses cfg.name trains on, decided on the whole batch; None = all of them."""
    keep_fn = get_loss(cfg.name).keep_fn
    return keep_fn(batch, cfg, kl) if keep_fn is not None else None
