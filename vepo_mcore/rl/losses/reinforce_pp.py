"""REINFORCE++ (Hu 2025): token-level KL in the reward, returns, batch-normalised advantages, PPO clip.

    r_t  = (R - b) * 1[t = last] - coef * k(old_logp_t, ref_logp_t)
    b    = 0, or the mean R of the response's group (rl.loss.reinforce_pp.baseline 'group':
           REINFORCE++-baseline, OpenRLHF's reinforce_baseline, verl's reinforce_plus_plus_baseline)
    G_t  = sum_{s >= t} gamma**(s - t) r_s                 (gamma = rl.loss.reinforce_pp.gamma, default 1)
    A_t  = (G_t - mean) / (std + eps)  over all response tokens of the batch
           (all-reduced over RLBatch.std_group when rl.loss.reinforce_pp.std_scope is 'global')
    loss = -agg_t min(r A, clip(r, 1 - eps_low, 1 + eps_low) A)

Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards [B] or [B, T], group_ids [B] for the group
baseline, ref_logp for KL.

Without the baseline every response is compared with the whole batch: when one prompt kind (a
direction) earns less reward than the others, all its responses get negative advantages and the
policy is pushed away from whatever it answers there. The group baseline compares each response
with the other answers to its own prompt, as GRPO and RLOO do, before the batch whitening.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import (
    discounted_returns,
    group_means,
    last_token_rewards,
    sequence_totals,
    whiten,
)
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import ensure_rewards, policy_loss, token_rewards
from vepo_mcore.rl.losses.registry import register_loss


@dataclass(kw_only=True)
class ReinforcePPOptions:
    """REINFORCE++'s own options (rl.loss.reinforce_pp): the returns' discount, where they are
    whitened, the reward baseline."""

    gamma: float = 1.0
    """Discount of the per-token returns."""
    std_scope: Literal["microbatch", "global"] = "microbatch"
    """Whiten the returns over the batch they are computed on, or all-reduced over data parallel."""
    baseline: Literal["none", "group"] = "none"
    """Subtract nothing from the reward (REINFORCE++), or the mean reward of the response's group
    (REINFORCE++-baseline)."""

    def validate(self) -> None:
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"rl.loss.reinforce_pp.gamma must be in [0, 1], got {self.gamma}")


def reinforce_pp_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    opts: ReinforcePPOptions = cfg.options_of("reinforce_pp")
    rewards = token_rewards(batch, kl, "reinforce_pp")
    if opts.baseline == "group":
        seq = sequence_totals(ensure_rewards(batch, "reinforce_pp").detach().to(torch.float32), batch.mask)
        rewards = rewards - last_token_rewards(group_means(seq, batch.group_ids), batch.mask)
    returns = discounted_returns(rewards, batch.mask, opts.gamma)
    group = batch.std_group if opts.std_scope == "global" else None
    return whiten(returns, batch.mask, cfg.adv_eps, group=group)


@register_loss("reinforce_pp", advantages=reinforce_pp_advantages, options=ReinforcePPOptions)
def reinforce_pp_loss(
    batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None
) -> tuple[torch.Tensor, dict]:
    adv = batch.advantages if batch.advantages is not None else reinforce_pp_advantages(batch, cfg, kl)
    return policy_loss(batch, cfg, kl, adv, symmetric_clip=True, default_kl_placement="reward")
