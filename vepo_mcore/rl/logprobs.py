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
target logit, sum p*z) per chunk; backward needs none. By default a chunk is as many tokens as
fit CHUNK_BYTES per work buffer, so the memory above the logits and their gradient is a few tens
of MiB at any T and V.

Precision (fp32 logits, checked against float64 at V = 152,064 with logits spread over ~50):
log-prob, entropy and gradient within 1e-5. Every sum over the vocabulary is a torch reduction
(pairwise on CPU); entropy is H = log s - sum p z with z shifted to <= 0, so neither term cancels;
the per-token arithmetic after the sums runs in float64 (O(T) work, off the hot path).

Gradients (z = logits / tau, p = softmax(z), H = -sum p log p):
    d logp / dz_j = 1[j = target] - p_j
    d H / dz_j    = -p_j (log p_j + H)
and d/dlogits = d/dz / tau. With `topk_frac` (the paper's approximation) the entropy is
H_k = -sum_{j in S} p_j log p_j over the set S of the ceil(frac * V) most probable real tokens
(no renormalisation), and d H_k / dz_j = p_j (P_S - H_k) - 1[j in S] p_j (log p_j + 1) with
P_S = sum_{j in S} p_j (S itself is treated as constant).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.models.output_loss import (
    DeferredOutputLayer,
    chunk_logits_grad,
    chunk_statistics,
    compute_dtype,
    group_rank_size,
)

# Imported where used: megatron.core (heavy, and optional here: without it, or before its parallel state
# exists, there is no TP group).

CHUNK_BYTES = 32 << 20
"""Default size of one work buffer ([chunk tokens, V_shard] in the compute dtype). Forward holds two,
backward one beside the logits' gradient, so the memory above the logits and their gradient is
32-64 MiB whatever T and V are (T = 2048, V = 152,064 fp32: 0.027 of the logits' 1.16 GiB). Smaller
chunks stay in cache better, but each chunk costs ~15 op launches, and on a shared 2-core machine
every multi-threaded op waits for its slowest thread: 32 MiB was the fastest there."""


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


def chunk_rows(shard_width: int, dtype: torch.dtype, chunk_bytes: int | None = None) -> int:
    """Tokens per chunk such that one [rows, shard_width] work buffer in the compute dtype takes at
    most `chunk_bytes` (None: CHUNK_BYTES), and at least one token."""
    row_bytes = max(1, shard_width) * torch.finfo(compute_dtype(dtype)).bits // 8
    return max(1, (CHUNK_BYTES if chunk_bytes is None else chunk_bytes) // row_bytes)


def _upcast(buf: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """The chunk in the compute dtype: itself when it already is, else copied into `buf`."""
    if chunk.dtype == buf.dtype:
        return chunk
    out = buf[: chunk.shape[0]]
    out.copy_(chunk)
    return out


class _FusedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, logits, targets, temperature, chunk_size, vocab_start, valid, vocab_size, group, world, topk_frac
    ):
        n = logits.shape[0]
        cdt = compute_dtype(logits.dtype)
        dev = logits.device
        out = {k: torch.empty(n, dtype=cdt, device=dev) for k in ("raw_max", "log_sum", "logp", "entropy")}
        if topk_frac is not None:
            out.update(
                top_thr=torch.empty(n, dtype=cdt, device=dev), top_mass=torch.empty(n, dtype=cdt, device=dev)
            )
        topk = None if topk_frac is None else (vocab_size, topk_frac, logits.shape[1])
        local_targets = targets - vocab_start
        in_shard = (local_targets >= 0) & (local_targets < valid)
        safe_targets = torch.where(in_shard, local_targets, torch.zeros_like(local_targets))
        # two chunk-sized work buffers, reused: fresh large allocations cost page faults on CPU
        rows = max(1, min(chunk_size, n))
        z_buf = torch.empty(rows, valid, dtype=cdt, device=dev)
        e_buf = torch.empty(rows, valid, dtype=cdt, device=dev)

        for start in range(0, n, chunk_size):
            sl = slice(start, min(n, start + chunk_size))
            src = _upcast(z_buf, logits[sl, :valid])  # [c, valid]
            # the raw target logit: only its owner contributes
            picked = logits[sl].gather(1, safe_targets[sl].unsqueeze(-1)).squeeze(-1).to(cdt)
            picked = torch.where(in_shard[sl], picked, torch.zeros_like(picked))
            stats = chunk_statistics(src, z_buf, e_buf, picked, temperature, group, world, topk)
            for key, value in vars(stats).items():
                if value is not None:
                    out[key][sl] = value
        del z_buf, e_buf

        ctx.save_for_backward(
            logits, safe_targets, in_shard, out["raw_max"], out["log_sum"], out["entropy"],
            out.get("top_thr"), out.get("top_mass"),
        )  # fmt: skip
        ctx.cfg = (temperature, chunk_size, valid)
        return out["logp"], out["entropy"]

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, safe_targets, in_shard, raw_max, log_sum, entropy, top_thr, top_mass = ctx.saved_tensors
        temperature, chunk_size, valid = ctx.cfg
        cdt = compute_dtype(logits.dtype)
        n, dev = logits.shape[0], logits.device
        grad_logp = torch.zeros(n, dtype=cdt, device=dev) if grad_logp is None else grad_logp.to(cdt)
        grad_entropy = None if grad_entropy is None else grad_entropy.to(cdt)
        grad = torch.empty_like(logits)
        grad[:, valid:] = 0  # padding columns
        nones = (None,) * 9
        if valid == 0 or n == 0:
            return (grad, *nones)
        target_grad = torch.where(in_shard, grad_logp, torch.zeros_like(grad_logp))
        rows = max(1, min(chunk_size, n))
        z_buf = torch.empty(rows, valid, dtype=cdt, device=dev)
        # when the logits already are in the compute dtype, p and the gradient live in `grad` itself
        in_place = logits.dtype == cdt
        p_buf = None if in_place else torch.empty(rows, valid, dtype=cdt, device=dev)
        for start in range(0, n, chunk_size):
            sl = slice(start, min(n, start + chunk_size))
            c = sl.stop - sl.start
            src = _upcast(z_buf, logits[sl, :valid])
            g = chunk_logits_grad(
                src, z_buf, grad[sl, :valid] if in_place else p_buf[:c], raw_max[sl], log_sum[sl], entropy[sl],
                None if top_thr is None else top_thr[sl], None if top_mass is None else top_mass[sl],
                grad_logp[sl], None if grad_entropy is None else grad_entropy[sl],
                safe_targets[sl], target_grad[sl], temperature,
            )  # fmt: skip
            if not in_place:
                grad[sl, :valid] = g
        return (grad, *nones)


def logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    vocab_size: int | None = None,
    group: Any = None,
    topk_frac: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `targets` and entropy under softmax(logits / temperature), vocab-parallel.

    logits: [N, V_shard] or [B, T, V_shard], this rank's contiguous vocab slice (rank r holds
        global columns [r * V_shard, (r + 1) * V_shard)); any float dtype.
    targets: [N] or [B, T] global token ids. Ids outside [0, vocab_size) (e.g. -100 padding)
        give a meaningless log-prob: give those positions zero weight in the loss.
    temperature: tau > 0.  chunk_size: tokens per chunk; None = as many as fit CHUNK_BYTES per work
        buffer (the memory above the logits and their gradient then does not grow with T).  vocab_size: the real (unpadded)
        vocabulary; None = every column is real.  group: the tensor-parallel process group;
        None = megatron's TP group when parallel_state is initialised, else a single process.
    topk_frac: None = exact entropy; f = -sum p log p over the ceil(f * vocab_size) most
        probable tokens (SPEC's `entropy_topk_frac`).
    Returns (logp, entropy), each [N] or [B, T], fp32 (float64 for float64 logits), both
    differentiable with respect to `logits`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if topk_frac is not None and not 0 < topk_frac <= 1:
        raise ValueError(f"topk_frac must be in (0, 1], got {topk_frac}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} disagree on tokens"
        )
    if group is None:
        group = _default_tp_group()
    rank, world = group_rank_size(group)
    shard = logits.shape[-1]
    if vocab_size is None:
        vocab_size = shard * world
    if not 0 < vocab_size <= shard * world:
        raise ValueError(f"vocab_size {vocab_size} must be in (0, {shard} * {world}] (shard width x TP size)")
    vocab_start = rank * shard
    valid = max(0, min(shard, vocab_size - vocab_start))
    if chunk_size is None:
        chunk_size = chunk_rows(valid, logits.dtype)
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


def policy_logprobs_and_entropy(
    logits: torch.Tensor | DeferredOutputLayer,
    targets: torch.Tensor,
    cfg,
    vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one rule for what an RL loss reads from the policy's logits (cfg: rl.loss, a LossConfig):
    the log-probs its ratio uses and the entropy at the sampling temperature tau = `temperature`
    (rl.rollout.sampling.temperature).

    ratio_mode 'tempered' (SPEC default): both under softmax(z / tau). 'scaled' (the appendix
    variant, r = exp((logp - old) / tau)) and 'untempered' (r = exp(logp - old) at tau 1, the
    ablation): untempered log-probs, but the entropy stays the sampling policy's, at tau (the VEPO shaping and bonus are about the distribution the samples come from).
    logits: [N, V_shard] / [B, T, V_shard] logits (shapes as logprobs_and_entropy), or the model's
    DeferredOutputLayer (hidden states [N, h] + output weight; targets [N]): then the output layer
    runs chunk by chunk inside this call and [N, V] never exists.
    """
    args = dict(chunk_size=cfg.logprob_chunk_size, vocab_size=vocab_size, topk_frac=cfg.entropy_topk_frac)
    if isinstance(logits, DeferredOutputLayer):
        fn = partial(_deferred_logprobs_and_entropy, logits)
    else:
        fn = partial(logprobs_and_entropy, logits)
    if cfg.ratio_mode == "tempered" or temperature == 1.0:
        tau = temperature if cfg.ratio_mode == "tempered" else 1.0
        return fn(targets, tau, **args)
    logp, _ = fn(targets, 1.0, **args)
    _, entropy = fn(targets, temperature, **args)
    return logp, entropy


def _deferred_logprobs_and_entropy(
    out: DeferredOutputLayer, targets, temperature, chunk_size, vocab_size, topk_frac
):
    # cfg.logprob_chunk_size sizes chunks of handed logits; the hidden-state path sizes its own by bytes
    lead_shape = targets.shape
    logp, entropy = out.logprobs_and_entropy(targets.reshape(-1), temperature, vocab_size, topk_frac)
    return logp.reshape(lead_shape), entropy.reshape(lead_shape)


def masked_policy_logprobs_and_entropy(
    logits: torch.Tensor | DeferredOutputLayer,
    targets: torch.Tensor,
    mask: torch.Tensor,
    cfg,
    vocab_size: int | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """policy_logprobs_and_entropy from the output of the masked positions only.

    logits: QwenGPTModel's output for `output_mask=mask` (the N positions where mask is True, in
    row-major order): logits [1, N, V_pad / TP], or with `defer_output_layer=True` a
    DeferredOutputLayer of N hidden states; targets, mask [b, s] -> log-probs and entropy [b, s], 0
    where mask is off.
    """
    logp, entropy = policy_logprobs_and_entropy(
        logits, targets[mask].unsqueeze(0), cfg, vocab_size, temperature
    )
    zeros = torch.zeros(mask.shape, dtype=logp.dtype, device=logp.device)
    return zeros.masked_scatter(mask, logp[0]), zeros.masked_scatter(mask, entropy[0])
