"""Fused vocab-parallel log-prob + entropy of the tempered policy (SPEC section 4).

    logp, entropy = logprobs_and_entropy(logits_shard, targets, temperature=tau, vocab_size=V)

`logits_shard` is this rank's slice of the output layer's logits, `[tokens, V_pad / TP]`
(or `[B, T, V_pad / TP]`, flattened), exactly as megatron's ColumnParallelLinear returns them.
For every token it returns log softmax(z / tau)[target] and the entropy of softmax(z / tau)
over the *real* vocabulary: columns whose global index is >= `vocab_size` (the padding rows
of the embedding, SPEC section 1) never take part.

Why a custom autograd function: the naive `log_softmax(z.float())` + gather + entropy keeps
several fp32 `[tokens, vocab]` tensors alive for backward (150k vocab x 4k tokens = 2.4 GB
each). Here tokens are processed in chunks; forward keeps only per-token scalars (max,
log-normaliser, entropy) and backward recomputes the softmax one chunk at a time, so the
only full-size tensors are the caller's logits and their gradient. Communication is over the
tensor-parallel group only: one MAX all-reduce (row max) and one SUM all-reduce (sum-exp,
target logit, sum p*z) per chunk; backward needs none.

Gradients (z = logits / tau, p = softmax(z), H = -sum p log p):
    d logp / dz_j = 1[j = target] - p_j
    d H / dz_j    = -p_j (log p_j + H)
and d/dlogits = d/dz / tau. With `topk_frac` (the paper's approximation) the entropy is
H_k = -sum_{j in S} p_j log p_j over the set S of the ceil(frac * V) most probable real tokens
(no renormalisation), and d H_k / dz_j = p_j (P_S - H_k) - 1[j in S] p_j (log p_j + 1) with
P_S = sum_{j in S} p_j (S itself is treated as constant).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist


def _default_tp_group() -> Any:
    """megatron's TP group when its parallel_state is initialised, else None (one process)."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    if not parallel_state.model_parallel_is_initialized():
        return None
    return parallel_state.get_tensor_model_parallel_group()


def _group_rank_size(group: Any) -> tuple[int, int]:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp32 for bf16/fp16/fp32 inputs; float64 only when the input already is (gradcheck, references).
    return torch.float64 if dtype == torch.float64 else torch.float32


def _upcast(buf: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """The chunk in the compute dtype: itself when it already is, else copied into `buf`."""
    if chunk.dtype == buf.dtype:
        return chunk
    out = buf[: chunk.shape[0]]
    out.copy_(chunk)
    return out


def _scaled_minus(buf: torch.Tensor, src: torch.Tensor, shift: torch.Tensor, inv_tau: float) -> torch.Tensor:
    """buf[:c] <- src * (1 / tau) - shift[:, None] in one pass (forward and backward use this same
    op on the same inputs, so the recomputed values are bit-identical)."""
    return torch.add(shift.neg().unsqueeze(-1), src, alpha=inv_tau, out=buf[: src.shape[0]])


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_j a_ij * b_ij per row, without a [c, V] temporary (a batched 1 x V by V x 1 product)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _all_reduce(t: torch.Tensor, op, group: Any, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class _FusedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, targets, temperature, chunk_size, vocab_start, valid, vocab_size, group, world, topk_frac
    ):
        n = logits.shape[0]
        cdt = _compute_dtype(logits.dtype)
        dev = logits.device
        row_max = torch.empty(n, dtype=cdt, device=dev)
        log_sum = torch.empty(n, dtype=cdt, device=dev)
        logp = torch.empty(n, dtype=cdt, device=dev)
        entropy = torch.empty(n, dtype=cdt, device=dev)
        top_thr = torch.empty(n, dtype=cdt, device=dev) if topk_frac is not None else None
        top_mass = torch.empty(n, dtype=cdt, device=dev) if topk_frac is not None else None
        local_targets = targets - vocab_start
        in_shard = (local_targets >= 0) & (local_targets < valid)
        safe_targets = torch.where(in_shard, local_targets, torch.zeros_like(local_targets))
        # two chunk-sized work buffers, reused: fresh large allocations cost page faults on CPU
        rows = min(chunk_size, n)
        inv_tau = 1.0 / temperature
        z_buf = torch.empty(rows, valid, dtype=cdt, device=dev)
        e_buf = torch.empty(rows, valid, dtype=cdt, device=dev)

        for start in range(0, n, chunk_size):
            sl = slice(start, min(n, start + chunk_size))
            c = sl.stop - sl.start
            src = _upcast(z_buf, logits[sl, :valid])  # [c, valid]
            if valid > 0:
                # max(z) / tau == max(z / tau): scaling by a positive number is monotonic
                m = src.amax(dim=-1).mul_(inv_tau).to(cdt)
            else:  # a rank holding only padding columns
                m = torch.full((c,), -math.inf, dtype=cdt, device=dev)
            m = _all_reduce(m, dist.ReduceOp.MAX, group, world)
            z = _scaled_minus(z_buf, src, m, inv_tau)  # z / tau - max
            e = torch.exp(z, out=e_buf[:c])
            sums = torch.zeros(3, c, dtype=cdt, device=dev)
            if valid > 0:
                sums[0] = e.sum(dim=-1)
                sums[1] = _row_dot(e, z)
                picked = z.gather(1, safe_targets[sl].unsqueeze(-1)).squeeze(-1)
                sums[2] = torch.where(in_shard[sl], picked, torch.zeros_like(picked))
            sums = _all_reduce(sums, dist.ReduceOp.SUM, group, world)
            s, ez, zt = sums[0], sums[1], sums[2]
            ls = torch.log(s)
            row_max[sl], log_sum[sl] = m, ls
            logp[sl] = zt - ls
            if topk_frac is None:
                entropy[sl] = ls - ez / s
            else:
                thr, mass, ent = _topk_entropy(
                    z, e, s, ls, vocab_size, topk_frac, logits.shape[1], group, world
                )
                top_thr[sl], top_mass[sl], entropy[sl] = thr, mass, ent
        del z_buf, e_buf

        ctx.save_for_backward(logits, safe_targets, in_shard, row_max, log_sum, entropy, top_thr, top_mass)
        ctx.cfg = (temperature, chunk_size, valid)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, safe_targets, in_shard, row_max, log_sum, entropy, top_thr, top_mass = ctx.saved_tensors
        temperature, chunk_size, valid = ctx.cfg
        cdt = _compute_dtype(logits.dtype)
        n, dev = logits.shape[0], logits.device
        grad_logp = torch.zeros(n, dtype=cdt, device=dev) if grad_logp is None else grad_logp.to(cdt)
        grad_entropy = torch.zeros(n, dtype=cdt, device=dev) if grad_entropy is None else grad_entropy.to(cdt)
        grad = torch.empty_like(logits)
        grad[:, valid:] = 0  # padding columns
        nones = (None,) * 9
        if valid == 0:
            return (grad, *nones)
        target_grad = torch.where(in_shard, grad_logp, torch.zeros_like(grad_logp))
        inv_tau = 1.0 / temperature
        rows = min(chunk_size, n)
        z_buf = torch.empty(rows, valid, dtype=cdt, device=dev)
        # when the logits already are in the compute dtype, p and the gradient live in `grad` itself
        in_place = logits.dtype == cdt
        p_buf = None if in_place else torch.empty(rows, valid, dtype=cdt, device=dev)
        for start in range(0, n, chunk_size):
            sl = slice(start, min(n, start + chunk_size))
            c = sl.stop - sl.start
            src = _upcast(z_buf, logits[sl, :valid])
            if top_thr is None:
                logp_all = _scaled_minus(z_buf, src, row_max[sl] + log_sum[sl], inv_tau)  # log p_j
                selected = None
            else:
                zs = _scaled_minus(z_buf, src, row_max[sl], inv_tau)
                # the top-k set is decided on the same values as in forward
                selected = zs >= top_thr[sl].unsqueeze(-1)
                logp_all = zs.sub_(log_sum[sl].unsqueeze(-1))
            p = torch.exp(logp_all, out=grad[sl, :valid] if in_place else p_buf[:c])
            g_lp, g_h = grad_logp[sl].unsqueeze(-1), grad_entropy[sl].unsqueeze(-1)
            # dL/dlogits = (1/tau) * dL/dz, with the 1/tau folded into the per-row coefficients
            if selected is None:
                # -p * (g_lp + g_h * (log p + H)) = p * (-g_h log p - (g_h H + g_lp))
                const = (g_h * entropy[sl].unsqueeze(-1) + g_lp).mul_(-inv_tau)
                g = p.mul_(logp_all.mul_(g_h * -inv_tau).add_(const))
            else:
                # p * (g_h (P_S - H_k) - g_lp) - 1[S] g_h p (log p + 1)
                const = (g_h * (top_mass[sl] - entropy[sl]).unsqueeze(-1) - g_lp).mul_(inv_tau)
                g = p.mul_(logp_all.add_(1.0).mul_(selected).mul_(g_h * -inv_tau).add_(const))
            g[torch.arange(c, device=dev), safe_targets[sl]] += target_grad[sl] * inv_tau
            if not in_place:
                grad[sl, :valid] = g
        return (grad, *nones)


def _topk_entropy(z, e, s, log_s, vocab_size, frac, shard, group, world):
    """Threshold (in shifted-logit space), probability mass and entropy of the top ceil(frac*V) tokens.

    z: [c, valid] logits minus the global row max; e = exp(z); s, log_s: [c] global sum-exp.
    """
    k = max(1, math.ceil(frac * vocab_size))
    cols = z.shape[1]
    local_k = min(k, cols)
    vals = z.topk(local_k, dim=-1).values if local_k > 0 else z.new_empty(z.shape[0], 0)
    # every rank contributes the same number of candidates (padded with -inf) so all_gather shapes match
    width = min(k, shard)
    if vals.shape[1] < width:
        pad = vals.new_full((vals.shape[0], width - vals.shape[1]), -math.inf)
        vals = torch.cat([vals, pad], dim=1)
    if world > 1:
        gathered = [torch.empty_like(vals) for _ in range(world)]
        dist.all_gather(gathered, vals.contiguous(), group=group)
        vals = torch.cat(gathered, dim=1)
    thr = vals.topk(min(k, vals.shape[1]), dim=-1).values[:, -1]
    sums = torch.zeros(2, z.shape[0], dtype=z.dtype, device=z.device)
    if cols > 0:
        sel = z >= thr.unsqueeze(-1)
        e_sel = e * sel
        sums[0] = e_sel.sum(dim=-1)
        sums[1] = _row_dot(e_sel, z)
        del sel, e_sel
    sums = _all_reduce(sums, dist.ReduceOp.SUM, group, world)
    mass = sums[0] / s
    # H_k = -sum_S p (z - log s) = -(sum_S e z) / s + P_S log s
    ent = mass * log_s - sums[1] / s
    return thr, mass, ent


def logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    vocab_size: int | None = None,
    group: Any = None,
    topk_frac: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` and entropy under softmax(logits / temperature), vocab-parallel.

    logits: [N, V_shard] or [B, T, V_shard], this rank's contiguous vocab slice (rank r holds
        global columns [r * V_shard, (r + 1) * V_shard)); any float dtype.
    targets: [N] or [B, T] global token ids. Ids outside [0, vocab_size) (e.g. -100 padding)
        give a meaningless log-prob: give those positions zero weight in the loss.
    temperature: tau > 0.  chunk_size: tokens per chunk.  vocab_size: the real (unpadded)
        vocabulary; None = every column is real.  group: the tensor-parallel process group;
        None = megatron's TP group when parallel_state is initialised, else a single process.
    topk_frac: None = exact entropy; f = -sum p log p over the ceil(f * vocab_size) most
        probable tokens (SPEC's `entropy_topk_frac`).
    Returns (logp, entropy), each [N] or [B, T], fp32 (float64 for float64 logits), both
    differentiable with respect to `logits`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if topk_frac is not None and not 0 < topk_frac <= 1:
        raise ValueError(f"topk_frac must be in (0, 1], got {topk_frac}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on tokens"
        )
    if group is None:
        group = _default_tp_group()
    rank, world = _group_rank_size(group)
    shard = logits.shape[-1]
    if vocab_size is None:
        vocab_size = shard * world
    if not 0 < vocab_size <= shard * world:
        raise ValueError(f"vocab_size {vocab_size} must be in (0, {shard} * {world}] (shard width x TP size)")
    vocab_start = rank * shard
    valid = max(0, min(shard, vocab_size - vocab_start))
    lead_shape = targets.shape
    flat_logits = logits.reshape(-1, shard)
    flat_targets = targets.reshape(-1).long()
    logp, entropy = _FusedLogprobEntropy.apply(
        flat_logits,
        flat_targets,
        float(temperature),
        int(chunk_size),
        vocab_start,
        valid,
        vocab_size,
        group,
        world,
        topk_frac,
    )
    return logp.reshape(lead_shape), entropy.reshape(lead_shape)


def reference_logprobs_and_entropy(
    full_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    topk_frac: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive full-vocab computation (tests and benchmarks): log_softmax + gather + entropy.

    full_logits: [..., V_pad] (all columns, one process); computed in the input's dtype.
    """
    z = full_logits[..., : (vocab_size or full_logits.shape[-1])] / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    if topk_frac is None:
        return logp, -(p * logp_all).sum(-1)
    k = max(1, math.ceil(topk_frac * z.shape[-1]))
    top = logp_all.topk(k, dim=-1).values
    return logp, -(top.exp() * top).sum(-1)


def policy_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, cfg, vocab_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one rule for what an RL loss reads from the policy's logits (cfg: rl.loss, a LossConfig):
    the log-probs its ratio uses and the entropy at the sampling temperature tau.

    ratio_mode 'tempered' (SPEC default): both under softmax(z / tau). 'scaled' (the appendix
    variant, r = exp((logp - old) / tau)): untempered log-probs, but the entropy stays the sampling
    policy's, at tau (the VEPO shaping and bonus are about the distribution the samples come from).
    Shapes as logprobs_and_entropy.
    """
    args = dict(chunk_size=cfg.logprob_chunk_size, vocab_size=vocab_size, topk_frac=cfg.entropy_topk_frac)
    if cfg.ratio_mode == "tempered" or cfg.temperature == 1.0:
        tau = cfg.temperature if cfg.ratio_mode == "tempered" else 1.0
        return logprobs_and_entropy(logits, targets, tau, **args)
    logp, _ = logprobs_and_entropy(logits, targets, 1.0, **args)
    _, entropy = logprobs_and_entropy(logits, targets, cfg.temperature, **args)
    return logp, entropy


def masked_policy_logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, cfg, vocab_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """policy_logprobs_and_entropy from the logits of the masked positions only.

    logits [1, N, V_pad / TP]: QwenGPTModel's output for `output_mask=mask` (the N positions where
    mask is True, in row-major order); targets, mask [b, s] -> log-probs and entropy [b, s], 0
    where mask is off.
    """
    logp, entropy = policy_logprobs_and_entropy(logits, targets[mask].unsqueeze(0), cfg, vocab_size)
    zeros = torch.zeros(mask.shape, dtype=logp.dtype, device=logp.device)
    return zeros.masked_scatter(mask, logp[0]), zeros.masked_scatter(mask, entropy[0])
