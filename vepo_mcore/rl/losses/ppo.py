"""PPO with a critic: GAE advantages (whitened), symmetric clip, clipped value loss; KL in the reward by default.

    r_t   = R * 1[t = last] - coef * k(old_logp_t, ref_logp_t)
    A, G  = gae(r, old_values, gamma, lambda); A whitened over the batch's response tokens
    L_pi  = -agg_t min(r A, clip(r, 1 - eps_low, 1 + eps_low) A)
    L_V   = agg_t 0.5 * max((V - G)^2, (V_old + clip(V - V_old, -c, c) - G)^2)
    loss  = L_pi + value_coef * L_V          (L_V only when RLBatch.values is given)

The critic is a separate GPTModel with a scalar head built elsewhere; it supplies `old_values`
(rollout time) and `values` (current, with gradient). Use `value_loss` alone to train it in
its own step. Inputs (RLBatch, [B, T]): logp, old_logp, mask, rewards, old_values, values, returns.
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import gae, whiten
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.losses.common import aggregate_masked, policy_loss, token_rewards
from vepo_mcore.rl.losses.registry import register_loss


def ppo_gae(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw GAE advantages, returns), [B, T]."""
    if batch.old_values is None:
        raise ValueError("PPO needs RLBatch.old_values (the critic's values at rollout time) for GAE")
    return gae(token_rewards(batch, kl, "ppo"), batch.old_values, batch.mask, cfg.gae_gamma, cfg.gae_lambda)


def ppo_advantages(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> torch.Tensor:
    adv, _ = ppo_gae(batch, cfg, kl)
    return whiten(adv, batch.mask, cfg.adv_eps, group=batch.std_group if cfg.std_scope == "global" else None)


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


@register_loss("ppo", advantages=ppo_advantages, needs_critic=True)
def ppo_loss(batch: RLBatch, cfg: LossConfig, kl: KLConfig | None = None) -> tuple[torch.Tensor, dict]:
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
            cfg.value_clip,
            cfg.loss_agg,
            batch.global_num_tokens,
        )
        loss = loss + cfg.value_coef * v_loss
        metrics.update(
            {"rl/value_loss": v_loss.detach(), "rl/value_clip_frac": v_clip, "rl/loss": loss.detach()}
        )
    return loss, metrics
