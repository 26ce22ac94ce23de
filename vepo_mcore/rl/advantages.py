"""Advantage estimators and reward transforms shared by the RL losses (SPEC section 4).

Shapes: B responses, T response-token positions (right-padded), `mask` [B, T] marks real
tokens. Sequence rewards are [B]; per-token rewards [B, T]. Every function returns zeros on
padding positions and nothing here carries gradient (advantages are stop-gradient by definition).
Standard deviations are unbiased (torch.std's default, as in GRPO); a population of one has std 0.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.rl.kl import kl_estimate

STD_SCOPES = ("microbatch", "group", "global")


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), x, torch.zeros_like(x))


def broadcast_to_tokens(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: each response's value on all of its tokens (0 on padding)."""
    return _masked(seq_values.to(torch.float32).unsqueeze(-1).expand(mask.shape), mask)


def token_positions(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B, T] position t = 0, 1, ... of each response token (counting only masked tokens)."""
    m = mask.long()
    return _masked(torch.cumsum(m, dim=1) - 1, m).to(torch.float32)


def last_token_rewards(seq_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: the sequence reward placed on each response's last token (PPO/REINFORCE++ style)."""
    m = mask.long()
    pos = torch.arange(m.shape[1], device=m.device).expand_as(m)
    last = torch.where(m.bool(), pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
    out = torch.zeros(
        m.shape,
        dtype=seq_rewards.dtype if seq_rewards.is_floating_point() else torch.float32,
        device=m.device,
    )
    return torch.where((pos == last) & m.bool(), seq_rewards.unsqueeze(-1).to(out.dtype), out)


def _unbiased_std(total: torch.Tensor, total_sq: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    mean = total / count.clamp_min(1)
    var = (total_sq - count * mean**2).clamp_min(0) / (count - 1).clamp_min(1)
    return torch.where(count > 1, var.sqrt(), torch.zeros_like(var))


def global_std(values: torch.Tensor, weight: torch.Tensor | None = None, group: Any = None) -> torch.Tensor:
    """Unbiased std of `values` (entries with weight 1) over every rank of `group` (all-reduced)."""
    v = values.detach().to(torch.float64)
    w = torch.ones_like(v) if weight is None else weight.to(torch.float64)
    stats = torch.stack([(v * w).sum(), (v * v * w).sum(), w.sum()])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(stats, group=group)
    return _unbiased_std(stats[0], stats[1], stats[2]).to(values.dtype)


def _group_index(group_ids: torch.Tensor | None, batch: int, device) -> tuple[torch.Tensor, int]:
    if group_ids is None:  # one group: the whole micro-batch
        return torch.zeros(batch, dtype=torch.long, device=device), 1
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if batch else 0


def group_normalized_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor | None,
    std_scope: str = "group",
    eps: float = 1e-6,
    reward_std: torch.Tensor | float | None = None,
    std_group: Any = None,
) -> torch.Tensor:
    """(R - group mean) / (std + eps) on every response token, [B, T].

    rewards: [B] sequence rewards or [B, T] per-token rewards (statistics over masked tokens).
    std_scope: 'microbatch' = std of all rewards here; 'group' = std within each prompt's group;
    'global' = `reward_std` if given, else all-reduced over `std_group`.
    """
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; known: {list(STD_SCOPES)}")
    b = mask.shape[0]
    rewards = rewards.detach().to(torch.float32)
    # per-sample weights of each reward entry: [B] -> one entry per response, [B, T] -> masked tokens
    if rewards.dim() == 1:
        vals, weight = rewards.unsqueeze(-1), torch.ones(b, 1, device=rewards.device)
    else:
        vals, weight = _masked(rewards, mask), mask.to(torch.float32)
    idx, n_groups = _group_index(group_ids, b, rewards.device)
    g_sum = torch.zeros(n_groups, device=rewards.device).index_add_(0, idx, (vals * weight).sum(1))
    g_sq = torch.zeros(n_groups, device=rewards.device).index_add_(0, idx, (vals * vals * weight).sum(1))
    g_cnt = torch.zeros(n_groups, device=rewards.device).index_add_(0, idx, weight.sum(1))
    g_mean = g_sum / g_cnt.clamp_min(1)
    if std_scope == "group":
        std = _unbiased_std(g_sum, g_sq, g_cnt)[idx].unsqueeze(-1)
    elif std_scope == "microbatch":
        std = _unbiased_std(g_sum.sum(), g_sq.sum(), g_cnt.sum())
    elif reward_std is not None:
        std = torch.as_tensor(reward_std, dtype=torch.float32, device=rewards.device)
    else:
        std = global_std(vals, weight, std_group).to(torch.float32)
    adv = (vals - g_mean[idx].unsqueeze(-1)) / (std + eps)
    return _masked(adv.expand(mask.shape), mask)


def entropy_shaped_advantages(
    base: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, alpha: float, gamma: float
) -> torch.Tensor:
    """VEPO: A = base * (1 + alpha * sg(H_t) * gamma**t), t the response-token position. All [B, T]."""
    t = token_positions(mask)
    shaping = 1.0 + alpha * entropy.detach().to(base.dtype) * torch.pow(
        torch.as_tensor(gamma, dtype=base.dtype), t
    )
    return _masked(base.detach() * shaping, mask)


def sequence_totals(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence rewards as they are; [B, T] per-token rewards -> [B], each response's sum over its tokens."""
    return rewards if rewards.dim() == 1 else _masked(rewards, mask).sum(1)


def _group_totals(r: torch.Tensor, group_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[B] -> ([B], [B]): the sum of `r` over each response's group and the group's size."""
    idx, n_groups = _group_index(group_ids, r.shape[0], r.device)
    g_sum = torch.zeros(n_groups, device=r.device).index_add_(0, idx, r)
    g_cnt = torch.zeros(n_groups, device=r.device).index_add_(0, idx, torch.ones_like(r))
    return g_sum[idx], g_cnt[idx]


def group_means(rewards: torch.Tensor, group_ids: torch.Tensor | None) -> torch.Tensor:
    """[B] -> [B]: the mean reward of each response's group (of the whole batch without group ids)."""
    total, count = _group_totals(rewards.detach().to(torch.float32), group_ids)
    return total / count.clamp_min(1)


def rloo_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor | None
) -> torch.Tensor:
    """RLOO: R_i - mean of the other responses to the same prompt, on every token; [B] -> [B, T].

    A group of one has no baseline and gets advantage 0.
    """
    r = rewards.detach().to(torch.float32)
    total, count = _group_totals(r, group_ids)
    others = count - 1
    adv = torch.where(others > 0, r - (total - r) / others.clamp_min(1), torch.zeros_like(r))
    return broadcast_to_tokens(adv, mask)


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = sum_{s >= t} gamma**(s - t) r_s within each response; [B, T] -> [B, T]."""
    r = _masked(token_rewards.detach().to(torch.float32), mask)
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running * mask[:, t].to(r.dtype)
        out[:, t] = running
    return _masked(out, mask)


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6, group: Any = None) -> torch.Tensor:
    """(x - mean) / (std + eps) over the masked entries (all-reduced over `group` when given)."""
    v = values.detach().to(torch.float32)
    w = mask.to(torch.float32)
    stats = torch.stack([(v * w).sum(), (v * v * w).sum(), w.sum()]).to(torch.float64)
    if group is not None:
        dist.all_reduce(stats, group=group)
    mean = (stats[0] / stats[2].clamp_min(1)).to(torch.float32)
    std = _unbiased_std(stats[0], stats[1], stats[2]).to(torch.float32)
    return _masked((v - mean) / (std + eps), mask)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each response; returns (advantages, returns), [B, T].

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last response token = 0),
    A_t = delta_t + gamma * lam * A_{t+1}, returns = A + V.
    """
    r = _masked(token_rewards.detach().to(torch.float32), mask)
    v = _masked(values.detach().to(torch.float32), mask)
    m = mask.to(torch.float32)
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], device=r.device)
    next_adv = torch.zeros(r.shape[0], device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        # padding positions pass the running values through untouched
        next_adv = torch.where(m[:, t] > 0, a, next_adv)
        next_value = torch.where(m[:, t] > 0, v[:, t], next_value)
        adv[:, t] = a
    adv = _masked(adv, mask)
    return adv, _masked(adv + v, mask)


def kl_penalty(
    old_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, estimator: str, coef: float
) -> torch.Tensor:
    """Per-token KL penalty coef * k(old, ref) for the reward (no gradient), [B, T]."""
    return _masked(coef * kl_estimate(estimator, old_logp.detach(), ref_logp.detach()), mask)


def dynamic_sampling_keep(rewards: torch.Tensor, group_ids: torch.Tensor | None) -> torch.Tensor:
    """DAPO dynamic sampling: [B] bool, True for responses whose group's rewards are not all equal."""
    r = rewards.detach().to(torch.float32)
    if r.dim() == 2:
        r = r.sum(1)
    idx, n_groups = _group_index(group_ids, r.shape[0], r.device)
    g_max = torch.full((n_groups,), -torch.inf, device=r.device).scatter_reduce(0, idx, r, "amax")
    g_min = torch.full((n_groups,), torch.inf, device=r.device).scatter_reduce(0, idx, r, "amin")
    return (g_max > g_min)[idx]


def overlong_penalty(
    lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment, [B]: 0 up to L_max - buffer, then linear down to -penalty at L_max.

    R_len = 0 if |y| <= L_max - L_buf; (L_max - L_buf - |y|) / L_buf * penalty if |y| <= L_max; -penalty beyond.
    """
    if buffer <= 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in (0, max_length={max_length}], got {buffer}")
    y = lengths.to(torch.float32)
    start = max_length - buffer
    soft = (start - y) / buffer * penalty
    return torch.where(
        y <= start, torch.zeros_like(y), torch.where(y <= max_length, soft, torch.full_like(y, -penalty))
    )
