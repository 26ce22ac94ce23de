"""VEPO: clip-higher PPO surrogate on entropy-shaped, group-normalised advantages + entropy bonus.

    A_{i,t} = sg((R_i - mean_group) / (std_scope + eps)) * (1 + alpha * sg(H_{i,t}) * gamma**t)
    loss    = -(1/N) sum_t min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) - beta (1/N) sum_t H [+ KL]

Inputs (RLBatch, [B, T]): logp, old_logp, mask, entropy (needed when alpha or beta != 0),
rewards [B] or [B, T] and group_ids [B] (or precomputed advantages), ref_logp for KL.
N = response tokens of the micro-batch, or of the global batch with loss_agg 'global_tokens'.
alpha, gamma, beta and std_scope are VEPOOptions (rl.loss.vepo); the clip and loss_agg are rl.loss's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import entropy_shaped_advantages, group_normalized_advantages
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import policy_loss, rewards_with_kl
from vepo_mcore.rl.losses.registry import register_loss


@dataclass(kw_only=True)
class VEPOOptions:
    """VEPO's own options (rl.loss.vepo): entropy shaping, entropy bonus, reward std scope."""

    alpha: float = 0.1
    """Entropy-shaped advantage strength (0 = no shaping: group-normalised advantages as GRPO's)."""
    gamma: float = 0.995
    """Position decay of the entropy shaping: token t's factor is 1 + alpha * H * gamma**t."""
    beta: float = 0.001
    """Entropy bonus coefficient (the bonus has a gradient; 0 = none)."""
    std_scope: Literal["microbatch", "group", "global"] = "microbatch"
    """Where the reward std for advantage normalisation is taken: all rewards of the batch the
    advantages are computed on (no all-reduce), each prompt's group, or all-reduced over data parallel."""

    def validate(self) -> None:
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"rl.loss.vepo.gamma must be in [0, 1], got {self.gamma}")


def vepo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    """The normalised rewards (R - group mean) / (std_scope + eps) on every token, before entropy shaping."""
    rewards = rewards_with_kl(batch, kl, "loss", "vepo")
    std_scope = cfg.options_of("vepo").std_scope
    return group_normalized_advantages(
        rewards, batch.mask, batch.group_ids, std_scope, cfg.adv_eps, batch.reward_std, batch.std_group
    )


@register_loss("vepo", advantages=vepo_advantages, options=VEPOOptions)
def vepo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    opts: VEPOOptions = cfg.options_of("vepo")
    base = batch.advantages if batch.advantages is not None else vepo_advantages(batch, cfg, kl)
    adv = base
    if opts.alpha != 0.0:
        if batch.entropy is None:
            raise ValueError(
                "VEPO with rl.loss.vepo.alpha != 0 needs RLBatch.entropy for the advantage shaping"
            )
        adv = entropy_shaped_advantages(base, batch.entropy, batch.mask, opts.alpha, opts.gamma)
    return policy_loss(batch, cfg, kl, adv, entropy_coef=opts.beta)
