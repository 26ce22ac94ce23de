"""The loss registry: `@register_loss("name", advantages=fn, options=NameOptions)`.

A loss is `loss_fn(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> (loss, metrics)`.
Its advantage function `advantages_fn(batch, cfg, kl) -> [B, T]` is registered beside it so the
trainer can compute advantages once on the whole global batch (set RLBatch.advantages) before
splitting it into micro-batches; a loss given a batch without advantages computes them itself.
Likewise an optional `keep_fn(batch, cfg, kl) -> [B] bool | None` (DAPO's dynamic sampling) decides
on the whole batch which responses the loss trains on (RLBatch.keep): a group split over
micro-batches is never whole inside one.

A loss's own options are a `@dataclass(kw_only=True)` beside it (a docstring on every field, a
`validate()` raising ValueErrors that name rl.loss.<name>.<field>), registered with it: the config
section rl.loss.<name> (`--rl.loss.vepo.alpha 0.1`); the loss reads it as `cfg.options_of("name")`.
Adding a loss is its file plus one import line in losses/__init__.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vepo_mcore.config.rl import LOSS_OPTIONS, KLConfig, LossConfig, register_loss_options
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
    options: type | None = None
    """The dataclass of its config section rl.loss.<name>; None = a loss without options."""


LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    advantages: AdvantageFn,
    keep: KeepFn | None = None,
    needs_critic: bool = False,
    options: type | None = None,
) -> Callable[[LossFn], LossFn]:

    def wrap(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered by {LOSSES[name].loss_fn.__module__}")
        if options is not None:
            register_loss_options(name, options)
        LOSSES[name] = LossSpec(name, fn, advantages, keep, needs_critic, options)
        return fn

    return wrap


def get_loss(name: str) -> LossSpec:
    if name not in LOSSES:
        raise ValueError(f"unknown rl.loss.name {name!r}; known: {sorted(LOSSES)}")
    return LOSSES[name]


def check_loss_options(cfg: LossConfig) -> None:
    """Every section rl.loss.<name> belongs to a registered loss with options and type-checks; the
    selected loss's section validates. ValueErrors name the section or its field."""
    for name in cfg.options:
        if name not in LOSS_OPTIONS:
            known = sorted(n for n, spec in LOSSES.items() if spec.options is not None)
            raise ValueError(
                f"rl.loss.{name}: no registered loss {name!r} has options (a loss without options, "
                f"or a misspelt loss); losses with options: {known}"
            )
        cfg.options_of(name)
    cfg.validate()


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
