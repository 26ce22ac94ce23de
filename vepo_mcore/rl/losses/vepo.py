"""VEPO: clip-higher PPO surrogate on entropy-shaped, group-normalised advantages + entropy bonus.

    A_{i,t} = sg((R_i - mean_group) / (std_scope + eps)) * (1 + alpha * sg(H_{i,t}) * gamma**t)
    loss    = -(1/N) sum_t min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) - beta (1/N) sum_t H [+ KL]

Inputs (RLBatch, [B, T]): logp, old_logp, mask, entropy (needed when alpha or beta != 0),
rewards [B] or [B, T] and group_ids [B] (or precomputed advantages), ref_logp for KL.
N = response tokens of the micro-batch, or of the global batch with loss_agg 'global_tokens'.
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import entropy_shaped_advantages, group_normalized_advantages
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import policy_loss, rewards_with_kl
from vepo_mcore.rl.losses.registry import register_loss


def vepo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    """The normalised rewards (R - group mean) / (std_scope + eps) on every token, before entropy shaping."""
    rewards = rewards_with_kl(batch, kl, "loss", "vepo")
    return group_normalized_advantages(
        rewards, batch.mask, batch.group_ids, cfg.std_scope, cfg.adv_eps, batch.reward_std, batch.std_group
    )


@register_loss("vepo", advantages=vepo_advantages)
def vepo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    base = batch.advantages if batch.advantages is not None else vepo_advantages(batch, cfg, kl)
    adv = base
    if cfg.alpha != 0.0:
        if batch.entropy is None:
            raise ValueError("VEPO with rl.loss.alpha != 0 needs RLBatch.entropy for the advantage shaping")
        adv = entropy_shaped_advantages(base, batch.entropy, batch.mask, cfg.alpha, cfg.gamma)
    return policy_loss(batch, cfg, kl, adv, entropy_coef=cfg.beta)
