"""GRPO (DeepSeekMath): group-normalised sequence advantages, symmetric clip, sequence-mean loss, KL in the loss.

    A_i = (R_i - mean_group) / (std_group + eps)   on every token of response i
    loss = -(1/B) sum_i (1/|o_i|) sum_t min(r A, clip(r, 1 - eps_low, 1 + eps_low) A) [+ coef * KL]

Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards [B] (or [B, T]), group_ids [B], ref_logp for KL.
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import group_normalized_advantages
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import policy_loss, rewards_with_kl
from vepo_mcore.rl.losses.registry import register_loss


def grpo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    rewards = rewards_with_kl(batch, kl, "loss", "grpo")
    return group_normalized_advantages(rewards, batch.mask, batch.group_ids, "group", cfg.adv_eps)


@register_loss("grpo", advantages=grpo_advantages)
def grpo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    adv = batch.advantages if batch.advantages is not None else grpo_advantages(batch, cfg, kl)
    return policy_loss(batch, cfg, kl, adv, symmetric_clip=True, agg="seq_mean")
