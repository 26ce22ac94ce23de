"""DAPO: clip-higher, token-level loss, dynamic sampling, overlong reward shaping.

    R'_i = R_i + overlong_penalty(|o_i|)                   (when rl.loss.dapo.overlong_buffer > 0)
    A_i  = (R'_i - mean_group) / (std_group + eps)          on every token of response i
    loss = -(1/N) sum_t min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) [+ KL]

Dynamic sampling: groups whose (shaped) rewards are all equal carry no signal. They are masked out of
the loss here (and out of its token count), decided on the whole rollout batch by the trainer
(RLBatch.keep, registry.compute_keep); rl.filtering.dynamic_sampling makes the trainer drop them
before the loss and refill the batch with new prompts (any loss).
Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards [B], group_ids [B]; response_lengths and
max_response_length for the overlong shaping; ref_logp for KL.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import dynamic_sampling_keep, group_normalized_advantages, overlong_penalty
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import policy_loss, rewards_with_kl
from vepo_mcore.rl.losses.registry import register_loss


@dataclass(kw_only=True)
class DAPOOptions:
    """DAPO's own options (rl.loss.dapo): the soft overlong punishment."""

    overlong_buffer: int = 0
    """Soft overlong punishment buffer length in tokens before the response cap (0 = off)."""
    overlong_penalty: float = 1.0
    """Maximal overlong penalty, reached at the cap."""

    def validate(self) -> None:
        if self.overlong_buffer < 0:
            raise ValueError(f"rl.loss.dapo.overlong_buffer must be >= 0, got {self.overlong_buffer}")
        if self.overlong_penalty < 0:
            raise ValueError(f"rl.loss.dapo.overlong_penalty must be >= 0, got {self.overlong_penalty}")


def dapo_rewards(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    """Rewards with the soft overlong punishment added (and the KL penalty when it goes in the reward)."""
    rewards = rewards_with_kl(batch, kl, "loss", "dapo")
    opts: DAPOOptions = cfg.options_of("dapo")
    if opts.overlong_buffer > 0:
        if batch.max_response_length is None:
            raise ValueError("rl.loss.dapo.overlong_buffer > 0 needs RLBatch.max_response_length")
        if rewards.dim() != 1:
            raise ValueError("DAPO overlong shaping needs sequence rewards [B], got per-token rewards")
        lengths = batch.response_lengths if batch.response_lengths is not None else batch.mask.sum(1)
        rewards = rewards + overlong_penalty(
            lengths, batch.max_response_length, opts.overlong_buffer, opts.overlong_penalty
        )
    return rewards


def dapo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    return group_normalized_advantages(
        dapo_rewards(batch, cfg, kl), batch.mask, batch.group_ids, "group", cfg.adv_eps
    )


def dapo_keep(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor | None:
    """[B] bool, False for groups whose shaped rewards are all equal; None without rewards (precomputed
    advantages). Decide it on the whole rollout batch: a micro-batch holds part of a group."""
    if batch.rewards is None:
        return None
    return dynamic_sampling_keep(dapo_rewards(batch, cfg, kl), batch.group_ids)


@register_loss("dapo", advantages=dapo_advantages, keep=dapo_keep, options=DAPOOptions)
def dapo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    adv = batch.advantages if batch.advantages is not None else dapo_advantages(batch, cfg, kl)
    kept_frac = None
    keep = batch.keep if batch.keep is not None else dapo_keep(batch, cfg, kl)
    if keep is not None:
        batch = dataclasses.replace(batch, mask=batch.mask.bool() & keep.unsqueeze(-1))
        kept_frac = keep.to(torch.float32).mean()
    loss, metrics = policy_loss(batch, cfg, kl, adv)
    if kept_frac is not None:
        metrics["rl/dynamic_sampling_kept"] = kept_frac
    return loss, metrics
