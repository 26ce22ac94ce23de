"""PPO with a critic: GAE advantages (whitened), symmetric clip, clipped value loss; KL in the reward by default.

    r_t   = R * 1[t = last] - coef * k(old_logp_t, ref_logp_t)
    A, G  = gae(r, old_values, gamma, lam); A whitened over the batch's response tokens
    L_pi  = -agg_t min(r A, clip(r, 1 - eps_low, 1 + eps_low) A)
    L_V   = agg_t 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)
    loss  = L_pi + value_coef * L_V          (L_V only when RLBatch.values is given)

The critic is a separate GPTModel with a scalar head built elsewhere; it supplies `old_values`
(rollout time) and `values` (current, with gradient). Use `value_loss` alone to train it in
its own step. Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards, old_values, values, returns.
gamma, lam, value_clip, value_coef and std_scope are PPOOptions (rl.loss.ppo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import gae, whiten
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import aggregate_masked, policy_loss, token_rewards
from vepo_mcore.rl.losses.registry import register_loss


@dataclass(kw_only=True)
class PPOOptions:
    """PPO's own options (rl.loss.ppo): GAE, the value loss, where advantages are whitened."""

    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    value_clip: float = 0.2
    """Value-function clip range: V stays within value_clip of the rollout's V_old in the clipped branch."""
    value_coef: float = 0.5
    """Value loss coefficient (when the policy loss also carries the value loss)."""
    std_scope: Literal["microbatch", "global"] = "microbatch"
    """Whiten the advantages over the batch they are computed on, or all-reduced over data parallel."""

    def validate(self) -> None:
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"rl.loss.ppo.gamma must be in [0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"rl.loss.ppo.lam must be in [0, 1], got {self.lam}")
        if self.value_clip <= 0:
            raise ValueError(f"rl.loss.ppo.value_clip must be > 0, got {self.value_clip}")
        if self.value_coef < 0:
            raise ValueError(f"rl.loss.ppo.value_coef must be >= 0, got {self.value_coef}")


def ppo_gae(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw GAE advantages, returns), [B, T]."""
    if batch.old_values is None:
        raise ValueError("PPO needs RLBatch.old_values (the critic's values at rollout time) for GAE")
    opts: PPOOptions = cfg.options_of("ppo")
    return gae(token_rewards(batch, kl, "ppo"), batch.old_values, batch.mask, opts.gamma, opts.lam)


def ppo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    adv, _ = ppo_gae(batch, cfg, kl)
    group = batch.std_group if cfg.options_of("ppo").std_scope == "global" else None
    return whiten(adv, batch.mask, cfg.adv_eps, group=group)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg: str,
    global_num_tokens: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * max((V - G)^2, (V_clip - G)^2) aggregated over `mask` like the policy
    loss; also the fraction of tokens where the clipped branch is larger. All inputs [B, T]."""
    old, ret = old_values.detach(), returns.detach()
    clipped = old + torch.clamp(values - old, -clip, clip)
    unclipped_err, clipped_err = (values - ret) ** 2, (clipped - ret) ** 2
    loss = aggregate_masked(0.5 * torch.maximum(unclipped_err, clipped_err), mask, agg, global_num_tokens)
    m = mask.bool()
    frac = ((clipped_err > unclipped_err) & m).sum() / m.sum().clamp_min(1)
    return loss, frac.detach()


@register_loss("ppo", advantages=ppo_advantages, needs_critic=True, options=PPOOptions)
def ppo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
    opts: PPOOptions = cfg.options_of("ppo")
    adv = batch.advantages if batch.advantages is not None else ppo_advantages(batch, cfg, kl)
    loss, metrics = policy_loss(batch, cfg, kl, adv, symmetric_clip=True, default_kl_placement="reward")
    if batch.values is not None:
        if batch.old_values is None:
            raise ValueError("PPO value loss needs RLBatch.old_values for the value clip")
        returns = batch.returns if batch.returns is not None else ppo_gae(batch, cfg, kl)[1]
        v_loss, v_clip = value_loss(
            batch.values,
            batch.old_values,
            returns,
            batch.mask,
            opts.value_clip,
            cfg.loss_agg,
            batch.global_num_tokens,
        )
        loss = loss + opts.value_coef * v_loss
        metrics.update(
            {"rl/value_loss": v_loss.detach(), "rl/value_clip_frac": v_clip, "rl/loss": loss.detach()}
        )
    return loss, metrics
