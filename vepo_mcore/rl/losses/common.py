"""Pieces every policy loss shares: the ratio, the clipped surrogate, token aggregation, KL, metrics.

All tensors are [B, T] with `mask` marking response tokens; padding positions never reach a
sum (they are zeroed before exp so garbage log-probs there cannot produce inf * 0 = nan).
"""

from __future__ import annotations

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.advantages import kl_penalty, last_token_rewards
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.kl import kl_estimate, kl_metrics

AGGREGATIONS = ("tokens", "global_tokens", "seq_mean")


def policy_ratio(batch: RLBatch, cfg: LossConfig) -> torch.Tensor:
    """r = exp(logp - old_logp) ('tempered', both tempered log-probs; 'untempered', both at tau 1) or
    exp((logp - old) / tau) ('scaled', tau = batch.temperature)."""
    diff = torch.where(batch.mask.bool(), batch.logp - batch.old_logp.detach(), torch.zeros_like(batch.logp))
    if cfg.ratio_mode in ("tempered", "untempered"):
        return torch.exp(diff)
    if cfg.ratio_mode == "scaled":
        return torch.exp(diff / batch.temperature)
    raise ValueError(
        f"unknown rl.loss.ratio_mode {cfg.ratio_mode!r}; known: ['tempered', 'scaled', 'untempered']"
    )


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> torch.Tensor:
    """min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A), per token (the objective to maximise); with
    dual_clip = c, max(that, c * A) where A < 0 (Ye et al. 2020, verl's clip_ratio_c)."""
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    if dual_clip is None:
        return surrogate
    return torch.where(adv < 0, torch.maximum(surrogate, dual_clip * adv), surrogate)


def aggregate(values: torch.Tensor, batch: RLBatch, mode: str) -> torch.Tensor:
    """Reduce per-token values [B, T] over the batch's mask: 'tokens', 'global_tokens' or 'seq_mean'."""
    return aggregate_masked(values, batch.fmask, mode, batch.global_num_tokens)


def aggregate_masked(
    values: torch.Tensor, mask: torch.Tensor, mode: str, global_num_tokens: float | None = None
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar over mask [B, T] (1 = counts): the token mean
    ('tokens'), the sum over `global_num_tokens` ('global_tokens'), or the mean of per-sequence means."""
    m = mask.to(values.dtype)
    total = (values * m).sum()
    if mode == "tokens":
        return total / m.sum().clamp_min(1)
    if mode == "global_tokens":
        if global_num_tokens is None or global_num_tokens <= 0:
            raise ValueError("rl.loss.loss_agg 'global_tokens' needs RLBatch.global_num_tokens (> 0)")
        return total / global_num_tokens
    if mode == "seq_mean":
        per_seq = (values * m).sum(1) / m.sum(1).clamp_min(1)
        has_tokens = (m.sum(1) > 0).to(values.dtype)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1)
    raise ValueError(f"unknown rl.loss.loss_agg {mode!r}; known: {list(AGGREGATIONS)}")


def kl_placement(kl: KLConfig | None, default: str) -> tuple[str | None, str]:
    """(estimator or None when KL is off, 'loss' | 'reward')."""
    if kl is None or kl.estimator == "none" or kl.coef == 0:
        return None, default
    return kl.estimator, default if kl.placement == "auto" else kl.placement


def _masked_values(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.detach()[mask.bool()]


def policy_loss(
    batch: RLBatch,
    cfg: LossConfig,
    kl: KLConfig | None,
    adv: torch.Tensor,
    *,
    symmetric_clip: bool = False,
    agg: str | None = None,
    entropy_coef: float = 0.0,
    default_kl_placement: str = "loss",
) -> tuple[torch.Tensor, dict]:
    """-agg(w * clipped surrogate) - entropy_coef * agg(H) + kl.coef * agg(k(logp, ref)) when KL is in the loss,
    w = batch.rollout_is_weights (rollout correction; 1 when None).

    batch tensors and adv are [B, T]. The clip is [1 - cfg.eps_low, 1 + cfg.eps_high] (clip-higher), or
    [1 - eps_low, 1 + eps_low] with symmetric_clip (PPO, GRPO, RLOO, REINFORCE++); agg defaults to
    cfg.loss_agg. Returns (scalar loss, metrics namespaced 'rl/...' as detached tensors).
    """
    eps_low = cfg.eps_low
    eps_high = cfg.eps_low if symmetric_clip else cfg.eps_high
    agg = cfg.loss_agg if agg is None else agg
    ratio = policy_ratio(batch, cfg)
    adv = adv.detach()
    surrogate = clipped_surrogate(ratio, adv, eps_low, eps_high, cfg.dual_clip)
    if batch.rollout_is_weights is not None:  # rollout correction: rl/rollout_correction.py
        surrogate = surrogate * batch.rollout_is_weights.detach()
    pg = -aggregate(surrogate, batch, agg)
    loss = pg
    metrics: dict = {"rl/pg_loss": pg.detach()}
    if entropy_coef != 0.0:
        if batch.entropy is None:
            raise ValueError(
                "this loss has an entropy bonus (e.g. rl.loss.vepo.beta != 0) but RLBatch.entropy is None"
            )
        bonus = aggregate(batch.entropy, batch, agg)
        loss = loss - entropy_coef * bonus
        metrics["rl/entropy_bonus"] = (entropy_coef * bonus).detach()
    estimator, placement = kl_placement(kl, default_kl_placement)
    if estimator is not None and batch.ref_logp is None:
        raise ValueError(f"rl.kl.estimator is {estimator!r} but RLBatch.ref_logp is None")
    if estimator is not None and placement == "loss":
        kl_term = aggregate(kl_estimate(estimator, batch.logp, batch.ref_logp.detach()), batch, agg)
        loss = loss + kl.coef * kl_term
        metrics["rl/kl_loss"] = (kl.coef * kl_term).detach()
    metrics["rl/loss"] = loss.detach()
    metrics.update(token_metrics(batch, ratio, adv, eps_low, eps_high))
    if cfg.dual_clip is not None:
        dual = (ratio.detach() > cfg.dual_clip) & (adv < 0) & batch.mask.bool()
        metrics["rl/clip_frac_dual"] = dual.sum() / batch.mask.bool().sum().clamp_min(1)
    return loss, metrics


def token_metrics(
    batch: RLBatch, ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> dict:
    """Clip fractions, ratio/advantage/entropy/KL statistics over response tokens (detached).

    A token counts as clipped-low when r < 1 - eps_low and A < 0, clipped-high when r > 1 + eps_high
    and A > 0: exactly the tokens whose surrogate gradient the clip removes.
    """
    m = batch.mask.bool()
    n = m.sum().clamp_min(1)
    with torch.no_grad():
        r, a = ratio.detach(), adv.detach()
        low = (r < 1.0 - eps_low) & (a < 0) & m
        high = (r > 1.0 + eps_high) & (a > 0) & m
        rv, av = _masked_values(r, m), _masked_values(a, m)
        out = {
            "rl/clip_frac_low": low.sum() / n,
            "rl/clip_frac_high": high.sum() / n,
            "rl/clip_frac": (low | high).sum() / n,
            "rl/ratio_mean": rv.mean() if rv.numel() else r.new_zeros(()),
            "rl/ratio_min": rv.min() if rv.numel() else r.new_zeros(()),
            "rl/ratio_max": rv.max() if rv.numel() else r.new_zeros(()),
            "rl/adv_mean": av.mean() if av.numel() else a.new_zeros(()),
            "rl/adv_std": av.std() if av.numel() > 1 else a.new_zeros(()),
            "rl/adv_min": av.min() if av.numel() else a.new_zeros(()),
            "rl/adv_max": av.max() if av.numel() else a.new_zeros(()),
            "rl/num_tokens": m.sum().to(torch.float32),
            "rl/response_len_mean": m.sum(1).to(torch.float32).mean(),
        }
        if batch.entropy is not None:
            out["rl/entropy"] = (batch.entropy.detach() * m).sum() / n
        if batch.rewards is not None:
            out["rl/reward_normalised_mean"] = batch.rewards.detach().to(torch.float32).mean()
        if batch.ref_logp is not None:
            out.update(kl_metrics(batch.logp.detach(), batch.ref_logp.detach(), m))
    return out


def ensure_rewards(batch: RLBatch, algorithm: str) -> torch.Tensor:
    if batch.rewards is None:
        raise ValueError(f"loss {algorithm!r} needs RLBatch.rewards (or precomputed RLBatch.advantages)")
    return batch.rewards


def rewards_with_kl(
    batch: RLBatch, kl: KLConfig | None, default_placement: str, algorithm: str
) -> torch.Tensor:
    """The batch's rewards, minus the KL penalty coef * k(old_logp, ref_logp) when the KL goes in the reward.

    [B] rewards lose the penalty summed over the response; [B, T] rewards lose it token by token.
    """
    rewards = ensure_rewards(batch, algorithm).detach().to(torch.float32)
    estimator, placement = kl_placement(kl, default_placement)
    if estimator is None or placement != "reward":
        return rewards
    if batch.ref_logp is None:
        raise ValueError(f"rl.kl.estimator is {estimator!r} (in the reward) but RLBatch.ref_logp is None")
    penalty = kl_penalty(batch.old_logp, batch.ref_logp, batch.mask, estimator, kl.coef)
    return rewards - penalty.sum(1) if rewards.dim() == 1 else rewards - penalty


def token_rewards(batch: RLBatch, kl: KLConfig | None, algorithm: str) -> torch.Tensor:
    """[B, T] per-token rewards for return-based methods (PPO, REINFORCE++): the sequence reward on the
    last response token, minus the per-token KL penalty when the KL goes in the reward."""
    r = ensure_rewards(batch, algorithm).detach().to(torch.float32)
    r = (
        last_token_rewards(r, batch.mask)
        if r.dim() == 1
        else torch.where(batch.mask.bool(), r, torch.zeros_like(r))
    )
    estimator, placement = kl_placement(kl, "reward")
    if estimator is not None and placement == "reward":
        if batch.ref_logp is None:
            raise ValueError(f"rl.kl.estimator is {estimator!r} (in the reward) but RLBatch.ref_logp is None")
        r = r - kl_penalty(batch.old_logp, batch.ref_logp, batch.mask, estimator, kl.coef)
    return r
