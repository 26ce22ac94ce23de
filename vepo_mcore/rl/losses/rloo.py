"""RLOO (Ahmadian et al. 2024): leave-one-out baseline, KL in the reward by default.

    R'_i = R_i - coef * sum_t k(old_logp, ref_logp)       (KL in the reward)
    A_i  = R'_i - (1 / (G - 1)) sum_{j != i in group} R'_j on every token of response i
    loss = -agg_t min(r A, clip(r, 1 - eps_low, 1 + eps_low) A)

Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards [B] (or [B, T], summed), group_ids [B], ref_logp for KL.
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import rloo_advantages as leave_one_out
from vepo_mcore.rl.advantages import sequence_totals
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import policy_loss, rewards_with_kl
from vepo_mcore.rl.losses.registry import register_loss


def rloo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    rewards = sequence_totals(rewards_with_kl(batch, kl, "reward", "rloo"), batch.mask)
    return leave_one_out(rewards, batch.mask, batch.group_ids)


@register_loss("rloo", advantages=rloo_advantages)
def rloo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    adv = batch.advantages if batch.advantages is not None else rloo_advantages(batch, cfg, kl)
    return policy_loss(batch, cfg, kl, adv, symmetric_clip=True, default_kl_placement="reward")
