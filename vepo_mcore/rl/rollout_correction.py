"""Rollout correction: importance weights pi_old / pi_rollout for the engine-trainer mismatch.

    weights, metrics = rollout_correction(exp.old_logp, exp.rollout_logp, exp.loss_mask, cfg.rl.rollout_correction)

The responses were sampled by the rollout engine (pi_rollout); the PPO ratio divides by the
trainer's recomputation of the same policy (pi_old). Where the two disagree (bf16 vs fp32 kernels,
FP8 rollouts), each token's policy-gradient term is weighed by rho = pi_old / pi_rollout, truncated
(TIS) or masked outside [lower, upper] (MIS); the losses multiply their clipped surrogate by the
weights (rl.losses.common.policy_loss). SPEC.md section 4, "Rollout correction", has the formulas.
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rollout_correction import RolloutCorrectionConfig

LOG_RATIO_BOUND = 20.0
"""|log rho| is clamped here before exp (exp(20) ~ 5e8), as verl and slime do: a sequence-level
product over hundreds of tokens would overflow otherwise."""


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    cfg: RolloutCorrectionConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(old_logp [B, T], rollout_logp [B, T], mask [B, T], cfg) -> (weights [B, T], metrics).

    old_logp: the trainer's log-probs of the sampled tokens; rollout_logp: the engine's; mask: 1 on
    response tokens (bool or float). weights: the importance weight of each response token, 0 off
    the mask (and on masked tokens in mode 'mask'); all ones on the mask with mode 'off'. No
    gradient flows through them.

    metrics (0-dim tensors, namespaced rollout_corr/): k3 = mean over tokens of rho_t - log rho_t - 1
    (KL(pi_rollout || pi_old), token level), ratio_max / ratio_min = extremes of rho at cfg.level
    before truncation; with a mode on, weight_mean and the shares of response tokens and of
    responses (any token) whose weight was truncated ('truncate') or masked ('mask'):
    truncated_token_frac / truncated_seq_frac or masked_token_frac / masked_seq_frac.
    """
    if not old_logp.shape == rollout_logp.shape == mask.shape or old_logp.dim() != 2:
        raise ValueError(
            f"rollout_correction needs old_logp, rollout_logp and mask of one [B, T] shape, got "
            f"{tuple(old_logp.shape)}, {tuple(rollout_logp.shape)}, {tuple(mask.shape)}"
        )
    with torch.no_grad():
        on = mask.bool()
        m = on.to(torch.float32)
        log_ratio = torch.where(on, old_logp.float() - rollout_logp.float(), torch.zeros_like(m))
        level_log_ratio = _level_log_ratio(log_ratio, m, cfg.level)
        rho = torch.exp(level_log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        token_log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        k3 = torch.exp(token_log_ratio) - token_log_ratio - 1.0
        n = m.sum().clamp_min(1.0)
        metrics = {
            "rollout_corr/k3": (k3 * m).sum() / n,
            "rollout_corr/ratio_max": rho[on].max() if on.any() else m.new_ones(()),
            "rollout_corr/ratio_min": rho[on].min() if on.any() else m.new_ones(()),
        }
        if cfg.mode == "off":
            return m.to(old_logp.dtype), metrics
        lower, upper = cfg.lower_bound(), cfg.upper
        outside = ((rho < lower) | (rho > upper)) & on
        if cfg.mode == "truncate":
            weights = rho.clamp(lower, upper) * m
        else:
            weights = torch.where(outside, torch.zeros_like(rho), rho) * m
        action = "truncated" if cfg.mode == "truncate" else "masked"
        rows_with_tokens = on.any(1)
        metrics |= {
            "rollout_corr/weight_mean": (weights * m).sum() / n,
            f"rollout_corr/{action}_token_frac": outside.sum() / n,
            f"rollout_corr/{action}_seq_frac": outside.any(1).sum() / rows_with_tokens.sum().clamp_min(1),
        }
    return weights.to(old_logp.dtype), metrics


def _level_log_ratio(log_ratio: torch.Tensor, m: torch.Tensor, level: str) -> torch.Tensor:
    """log rho at `level`, [B, T]: per token, or a response's sum ('sequence') or mean ('geometric')
    of its token log-ratios broadcast over the row."""
    if level == "token":
        return log_ratio
    total = (log_ratio * m).sum(1, keepdim=True)
    if level == "sequence":
        return total.expand_as(log_ratio)
    if level == "geometric":
        return (total / m.sum(1, keepdim=True).clamp_min(1.0)).expand_as(log_ratio)
    raise ValueError(
        f"unknown rl.rollout_correction.level {level!r}; known: ['token', 'sequence', 'geometric']"
    )
