"""The output layer and its loss, chunk by chunk: never a [tokens, vocab] tensor.

    loss = output_layer_cross_entropy(hidden, weight, labels, group=tp)              # CPT / SFT, [N]
    logp, entropy = output_layer_logprobs(hidden, weight, targets, tau, vocab_size)  # RL, [N] each

hidden [N, h] are the final hidden states of the positions a loss reads (identical on every TP rank),
weight [V_pad / TP, h] this rank's rows of the vocab-parallel output layer (megatron's
ColumnParallelLinear, or the tied embedding). For each chunk of tokens the logits [c, V_pad / TP] are
computed by one GEMM into a reused buffer, reduced to per-token scalars (row max, log-normaliser,
target logit, entropy; across TP by one MAX and one SUM all-reduce per chunk, as megatron's
vocab_parallel_cross_entropy does for the whole tensor) and dropped. Backward recomputes each chunk's
logits, turns them into dL/dlogits in place and feeds the two GEMMs (dL/dhidden, dL/dweight), so the
memory above the weights and their gradient is two chunk buffers whatever T is: never T x V.
dL/dhidden is this rank's partial sum over its vocab slice; the caller wraps `hidden` in megatron's
copy_to_tensor_model_parallel_region (or the sequence-parallel gather) as ColumnParallelLinear does,
whose backward all-reduces it.

On CPU the cross-entropy whose gradients are built in forward (`loss_weights`) computes a chunk of
few tokens vocabulary-major instead, block by block of vocabulary rows while each block is in the
cache (`vocab_major_chunk`): MKL's sgemm writes [V, c] faster than [c, V].

`DeferredOutputLayer` is what QwenGPTModel returns for `defer_output_layer=True`: the hidden states
and the weight, for a loss that wants log-probs and entropy (rl.logprobs) instead of logits.

The per-chunk arithmetic (`chunk_statistics`, `chunk_logits_grad`) is shared with rl.logprobs, which
applies it to logits it is handed. Precision: sums over the vocabulary are torch reductions (pairwise
on CPU); entropy is log s - sum p z with z shifted to <= 0 (no cancellation); per-token arithmetic in
float64. Log-prob and entropy are within 1e-5 of float64 in fp32 (tests/unit/test_logprobs.py,
tests/unit/test_output_loss.py). The loss-weighted cross-entropy takes its logits in exp2's units
(log2(e) carried into the GEMM by the hidden state) and is as close to float64 as torch's fp32
cross-entropy on fp32 logits.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.models.main_grad import dummy_weight_grad, fused_main_grad
from vepo_mcore.parallel.device import without_shim_mode

LOG2E = 1.0 / math.log(2.0)
CHUNK_BYTES = 256 << 20
"""One [chunk tokens, V_pad / TP] work buffer of the hidden-state path (the CPT/SFT loss holds one in
the compute dtype, plus the GEMM output under bf16 weights; the RL log-prob + entropy two). At
V = 152,064 in fp32 that is 441 tokens: the output layer's GEMMs run at their full rate on CPU
(the train step against megatron's raw step, benchmarks/train_step.py: 0.90x at 64 MiB, 0.93x at
128, 0.99x at 256), and it stays a constant well below the logits of a long micro-batch. N tokens
go in the fewest chunks this allows, of equal size (`even_chunk`)."""

CUDA_CHUNK_BYTES = 1 << 30
"""The same buffer on a GPU, where a chunk's elementwise passes are bound by kernel launches and memory
bandwidth rather than the cache: on an H200 at Qwen2.5-7B's shape (hidden 3584, V = 152,064, bf16,
TP = 1; benchmarks/output_layer_gpu.py, 4,096 / 16,384 tokens) the CPT/SFT cross-entropy ran at
0.55 / 0.60x the speed of megatron's logits + vocab_parallel_cross_entropy in chunks of 256 MiB (441
tokens), 0.80 / 0.85x at 1 GiB (1,765) and 0.90 / 0.98x in chunks of 8,192 tokens; peak memory at
16,384 tokens 3.5, 4.7 and 10.4 GiB against megatron's 19.0. The RL log-prob + entropy at 1 GiB: 1.38
/ 1.26x the logits path's speed. At the 7B recipes' TP = 4 a GiB holds 7,060 tokens: a whole micro-batch
of 4,096."""


BLOCK_BYTES = 2 << 20
"""One block of vocabulary rows of a chunk's vocabulary-major logits on the CPU cross-entropy path
(`vocab_major_chunk`): small enough that its elementwise passes and both gradient GEMMs read it from
the cache the GEMM wrote it to."""
VOCAB_MAJOR_BYTES = 512 << 10
"""The CPU cross-entropy with an expected gradient runs vocabulary-major (`vocab_major_chunk`) when one
chunk's hidden states [c, h] take at most this; every block's GEMMs read them and write their
gradient again, which then stays in the cache. Measured at hidden 256 (benchmarks/train_step.py,
2026-11-27): the train step 3% faster at 256-token chunks of the 152k vocabulary, slower at the toy's
2,048-token chunks. 0: always token-major, the layout every other path uses."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp32 for bf16/fp16/fp32 inputs; float64 only when the input already is (gradcheck, references).
    return torch.float64 if dtype == torch.float64 else torch.float32


def group_rank_size(group: Any) -> tuple[int, int]:
    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def all_reduce(t: torch.Tensor, op, group: Any, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def log2e(dtype: torch.dtype) -> float:
    """log2(e) rounded to `dtype` (its value as a Python float: the factor actually applied)."""
    return torch.tensor(LOG2E, dtype=dtype).item()


def base2_shifted(
    buf: torch.Tensor, src: torch.Tensor, raw_max: torch.Tensor, temperature: float
) -> torch.Tensor:
    """buf[:c] <- (src - max) / tau * log2(e): the tempered logits shifted to <= 0, in base-2 units
    (`buf` may be `src`'s own storage).

    exp2 of these is exp((src - max) / tau), and torch's exp2 runs ~3x faster than its exp on CPU.
    Subtracting the max first keeps each element's rounding relative to its own shifted value, and
    dividing by tau (not multiplying by a rounded 1 / tau) adds no error shared by all elements: a
    shared relative error d tilts the distribution and moves H by d * Var_p(z). The one shared
    factor left, log2(e) in fp32, is off by 1.3e-8. Forward and backward call this on the same
    inputs, so the values (and the top-k set) are bit-identical.
    """
    t = torch.sub(src, raw_max.unsqueeze(-1), out=buf[: src.shape[0]])
    if temperature != 1.0:
        t.div_(temperature)
    return t.mul_(log2e(t.dtype))


@dataclass
class ChunkStats:
    """Per-token results of one chunk: row max of the raw logits (compute dtype), natural log of the
    sum of exp((z - max) / tau), log-prob and entropy (float64); top-k threshold and mass or None."""

    raw_max: torch.Tensor
    log_sum: torch.Tensor
    logp: torch.Tensor
    entropy: torch.Tensor
    top_thr: torch.Tensor | None = None
    top_mass: torch.Tensor | None = None


def chunk_statistics(
    src: torch.Tensor,
    z_buf: torch.Tensor,
    e_buf: torch.Tensor,
    picked: torch.Tensor,
    temperature: float,
    group: Any,
    world: int,
    topk: tuple[int, float, int] | None = None,
    need_entropy: bool = True,
    base2: bool = False,
) -> ChunkStats:
    """Log-prob and entropy of one chunk of this rank's logits (the whole vocabulary across TP).

    src [c, valid]: the logits of the real columns, compute dtype (fp32/float64); may be z_buf's own
    storage (then overwritten). z_buf, e_buf [>= c, valid]: work buffers (e_buf may be z_buf when
    neither the entropy nor the top-k is wanted: then exp is taken in place). picked [c]: the raw target
    logit where this rank holds the target, else 0. topk: (vocab_size, frac, shard width) for the
    top-k entropy, None for the exact one. need_entropy=False skips the entropy (returned as 0).
    base2: src and picked are already logits / tau * log2(e) (the hidden state carried the factor into
    the GEMM), so no pass scales them; raw_max still comes back in the logits' units.
    """
    c, valid = src.shape
    cdt, dev = src.dtype, src.device
    if valid > 0:
        m = src.amax(dim=-1)  # the max of the raw logits: tau > 0 keeps the argmax
    else:  # a rank holding only padding columns
        m = torch.full((c,), -math.inf, dtype=cdt, device=dev)
    m = all_reduce(m, dist.ReduceOp.MAX, group, world)
    if base2:
        t = torch.sub(src, m.unsqueeze(-1), out=z_buf[:c])
    else:
        t = base2_shifted(z_buf, src, m, temperature)  # (logits - max) / tau / ln 2 <= 0
    e = torch.exp2(t, out=e_buf[:c])
    sums = torch.zeros(3, c, dtype=cdt, device=dev)
    if valid > 0:
        # torch's CPU reductions sum float rows pairwise (error ~ log V, not V, roundings);
        # a BLAS dot (bmm) accumulates sequentially and was 40x less accurate here
        sums[0] = e.sum(dim=-1)
        sums[2] = picked  # only the target's owner contributes, so the all-reduce sum is exact
        if topk is None and need_entropy:
            sums[1] = e.mul_(t).sum(dim=-1)  # sum e * t over nonpositive t: no cancellation
    sums = all_reduce(sums, dist.ReduceOp.SUM, group, world)
    # per-token scalars in float64 (O(T) work): the results then carry one fp32 rounding each
    s, et, target = sums.to(torch.float64).unbind(0)
    ls = torch.log(s)
    m64 = m.to(torch.float64)
    if base2:  # the difference in base-2 units is already divided by tau
        logp = (target - m64) / LOG2E - ls
        m = (m64 * (temperature / LOG2E)).to(cdt)
    else:
        logp = (target - m64) / temperature - ls
    if topk is not None:
        thr, mass, ent = _topk_entropy(t, e, s, ls, *topk, group, world)
        return ChunkStats(m, ls, logp, ent, thr, mass)
    # H = log s - sum p z with z = t / log2(e) shifted: both terms >= 0, no cancellation
    ent = ls - et / (s * log2e(cdt)) if need_entropy else torch.zeros_like(ls)
    return ChunkStats(m, ls, logp, ent)


def chunk_logits_grad(
    src: torch.Tensor,
    z_buf: torch.Tensor,
    out: torch.Tensor,
    raw_max: torch.Tensor,
    log_sum: torch.Tensor,
    entropy: torch.Tensor,
    top_thr: torch.Tensor | None,
    top_mass: torch.Tensor | None,
    grad_logp: torch.Tensor,
    grad_entropy: torch.Tensor | None,
    targets: torch.Tensor,
    target_grad: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """out <- dL/dlogits of one chunk [c, valid], from the forward's per-token scalars (all [c]).

    src: the chunk's logits (compute dtype; may be z_buf's storage, then overwritten); out: [c, valid]
    in the compute dtype (may not alias src). grad_entropy None: the loss does not read the entropy.
    targets: local column of each target (any valid column where not on this rank); target_grad:
    dL/dlogp where this rank holds the target, else 0.

    With z = logits / tau, p = softmax(z), H = -sum p log p:
        d logp / dz_j = 1[j = target] - p_j,   d H / dz_j = -p_j (log p_j + H)
    and d/dlogits = d/dz / tau. Top-k entropy H_k over the set S of the k most probable tokens:
    d H_k / dz_j = p_j (P_S - H_k) - 1[j in S] p_j (log p_j + 1), P_S = sum_S p (S held constant).
    """
    c = src.shape[0]
    inv_tau = 1.0 / temperature
    g_lp = grad_logp.unsqueeze(-1)
    if top_thr is None:
        # log2 p_j = (logits_j - max) / tau / ln 2 - log2 s: one rounded factor, whose error
        # is relative to the shifted value; the gradient needs no more than that
        y = torch.sub(src, raw_max.unsqueeze(-1), out=z_buf[:c])
        log2p = torch.add((log_sum * -LOG2E).unsqueeze(-1), y, alpha=inv_tau * LOG2E, out=y)
        p = torch.exp2(log2p, out=out)
        if grad_entropy is None:
            g = p.mul_(g_lp * -inv_tau)
        else:
            g_h = grad_entropy.unsqueeze(-1)
            # -p * (g_lp + g_h * (log p + H)) = p * (-(g_h H + g_lp) - g_h ln2 log2 p)
            const = (g_h * entropy.unsqueeze(-1) + g_lp).mul_(-inv_tau)
            g = p.mul_(log2p.mul_(g_h * (-inv_tau / LOG2E)).add_(const))
    else:
        g_h = (torch.zeros_like(grad_logp) if grad_entropy is None else grad_entropy).unsqueeze(-1)
        t = base2_shifted(z_buf, src, raw_max, temperature)
        selected = t >= top_thr.unsqueeze(-1)  # the same values as in forward: the same set
        log2p = t.sub_((log_sum * LOG2E).unsqueeze(-1))
        p = torch.exp2(log2p, out=out)
        # p * (g_h (P_S - H_k) - g_lp) - 1[S] g_h p (log p + 1), log p + 1 = ln2 (log2 p + log2 e)
        const = (g_h * (top_mass - entropy).unsqueeze(-1) - g_lp).mul_(inv_tau)
        g = p.mul_(log2p.add_(LOG2E).mul_(selected).mul_(g_h * (-inv_tau / LOG2E)).add_(const))
    g[torch.arange(c, device=g.device), targets] += target_grad * inv_tau
    return g


def vocab_major_chunk(
    gemm_in: torch.Tensor,
    w: torch.Tensor,
    buf: torch.Tensor,
    picked: torch.Tensor,
    temperature: float,
    group: Any,
    world: int,
) -> tuple[ChunkStats, torch.Tensor]:
    """Log-prob of one chunk computed vocabulary-major, block by block: the CPU cross-entropy's forward.

    gemm_in [c, h]: the chunk's hidden states times log2(e) / tau, so the GEMM's output z' is in
    base-2 units; w [valid, h]; buf [valid, c] (contiguous) receives, block of `block_rows` rows by
    block, exp2(z' - the block's max per token); picked [c]: the target's z' where this rank holds it,
    else 0. Returns the chunk's statistics (entropy 0) and p_scale [blocks, c] (float64), which turns
    each block of buf into probabilities: p = buf[block] * p_scale[block].

    Why vocabulary-major: MKL's sgemm writes the token-major [c, V] logits of hidden 256 at about two
    thirds of the rate it writes the vocabulary-major [V, c] (two Zen 4 cores: ~125 against ~170
    GFLOP/s, the dL/dhidden and dL/dweight GEMMs' rate). Per-token reductions over a whole
    vocabulary-major buffer are strided and slow; over a block still in the cache they are not.
    """
    c, valid = gemm_in.shape[0], w.shape[0]
    rows = block_rows(c, buf.dtype)
    starts = range(0, valid, rows)
    block_max = torch.empty(len(starts), c, dtype=buf.dtype, device=buf.device)
    block_sum = torch.empty_like(block_max)
    for b, start in enumerate(starts):
        blk = torch.mm(w[start : start + rows], gemm_in.t(), out=buf[start : start + rows])
        torch.amax(blk, dim=0, out=block_max[b])
        torch.sum(blk.sub_(block_max[b]).exp2_(), dim=0, out=block_sum[b])
    m = all_reduce(block_max.amax(dim=0), dist.ReduceOp.MAX, group, world)
    m64 = m.to(torch.float64)
    shift = torch.exp2(block_max.to(torch.float64) - m64)  # [blocks, c]: each block's max against m
    sums = torch.stack([(block_sum.to(torch.float64) * shift).sum(dim=0), picked.to(torch.float64)])
    s, target = all_reduce(sums, dist.ReduceOp.SUM, group, world).unbind(0)
    log_sum = torch.log(s)
    logp = (target - m64) / LOG2E - log_sum
    raw_max = (m64 * (temperature / LOG2E)).to(buf.dtype)  # in the logits' units
    return ChunkStats(raw_max, log_sum, logp, torch.zeros_like(logp)), shift / s


def block_rows(tokens: int, dtype: torch.dtype) -> int:
    """Vocabulary rows per block of a vocabulary-major chunk of `tokens` columns: BLOCK_BYTES each."""
    return max(1, BLOCK_BYTES // (max(1, tokens) * dtype.itemsize))


def _topk_entropy(t, e, s, log_s, vocab_size, frac, shard, group, world):
    """Threshold (in t's units), probability mass and entropy of the top ceil(frac*V) tokens.

    t: [c, valid] tempered logits minus the global row max, in base-2 units; e = exp2(t) (overwritten);
    s, log_s: [c] global sum-exp and its natural log (float64). Returns thr in t's dtype, mass and
    entropy in s's.
    """
    k = max(1, math.ceil(frac * vocab_size))
    cols = t.shape[1]
    local_k = min(k, cols)
    vals = t.topk(local_k, dim=-1).values if local_k > 0 else t.new_empty(t.shape[0], 0)
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
    sums = torch.zeros(2, t.shape[0], dtype=t.dtype, device=t.device)
    if cols > 0:
        e_sel = e.mul_(t >= thr.unsqueeze(-1))
        sums[0] = e_sel.sum(dim=-1)
        sums[1] = e_sel.mul_(t).sum(dim=-1)
    sums = all_reduce(sums, dist.ReduceOp.SUM, group, world).to(s.dtype)
    mass = sums[0] / s
    # H_k = -sum_S p (z - log s) = -(sum_S e z) / s + P_S log s, z = t / log2(e)
    ent = mass * log_s - sums[1] / (s * log2e(t.dtype))
    return thr, mass, ent


def chunk_tokens(
    shard_width: int, dtype: torch.dtype, chunk_bytes: int | None = None, device_type: str = "cpu"
) -> int:
    """Tokens per chunk of the hidden-state path: one [tokens, shard_width] buffer in the compute dtype
    takes at most `chunk_bytes` (None: CUDA_CHUNK_BYTES on a GPU, else CHUNK_BYTES); at least one token."""
    if chunk_bytes is None:
        chunk_bytes = CUDA_CHUNK_BYTES if device_type == "cuda" else CHUNK_BYTES
    row_bytes = max(1, shard_width) * torch.finfo(compute_dtype(dtype)).bits // 8
    return max(1, chunk_bytes // row_bytes)


def even_chunk(n: int, most: int) -> int:
    """Tokens per chunk for n tokens in chunks of at most `most`: the fewest chunks, of equal size.

    An output-layer GEMM's time is about a fixed part (MKL packs the whole [V, h] weight for the
    logits and the dgrad GEMM of every chunk) plus a part per row, so a short last chunk pays the
    fixed part for little work (fp32, V = 152k, 2 cores: 2.1 ms per row for the three GEMMs at 70
    rows, 1.44 at 256, 1.37 at 442); equal chunks spread the rows over the same number of GEMMs.
    """
    chunks = max(1, -(-n // max(1, most)))
    return max(1, -(-n // chunks))


class HostBuffers:
    """Large CPU work buffers kept between calls and handed out again (best fit).

    A fresh CPU allocation of this size is mmap'd and costs a page fault per 4 KiB page on first
    touch: ~30 ms per 64 MiB on this project's 2-core machine, several times the chunk's own
    elementwise work. CUDA's caching allocator already reuses its blocks, so elsewhere `take` is
    torch.empty. At most `keep` buffers are kept (the largest); a buffer must be given back before
    it is handed out again, so a buffer held from forward to backward is never shared.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep
        self.free: list[torch.Tensor] = []  # flat uint8 tensors
        self.lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=device)
        nbytes = math.prod(shape) * dtype.itemsize
        with self.lock:
            fits = [raw for raw in self.free if raw.numel() >= max(1, nbytes)]
            raw = min(fits, key=torch.Tensor.numel) if fits else None
            if raw is not None:
                self.free = [r for r in self.free if r is not raw]
        if raw is None:
            raw = torch.empty(max(1, nbytes), dtype=torch.uint8)
        return raw[:nbytes].view(dtype).view(shape)

    def give(self, *tensors: torch.Tensor | None) -> None:
        """Hand back tensors `take` returned (None and non-CPU tensors are ignored); neither they nor
        any view of them may be used afterwards."""
        with self.lock:
            for t in tensors:
                if t is None or t.device.type != "cpu":
                    continue
                raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())  # the whole buffer
                if all(raw.data_ptr() != f.data_ptr() for f in self.free):
                    self.free.append(raw)
            self.free = sorted(self.free, key=torch.Tensor.numel)[-self.keep :]

    def release(self) -> None:
        """Drop the kept buffers (their memory goes back to the system)."""
        with self.lock:
            self.free = []


BUFFERS = HostBuffers()


def add_weight_grad(dst: torch.Tensor, g: torch.Tensor, h: torch.Tensor, part: torch.Tensor | None) -> None:
    """dst [valid, h] += g^T h; g [c, valid], h [c, h]. In one GEMM where the dtypes agree, else
    through `part` [valid, h] in the GEMM's dtype (bf16 GEMMs summed into an fp32 buffer)."""
    if dst.dtype == g.dtype == h.dtype:
        dst.addmm_(g.t(), h)
    else:
        dst.add_(torch.mm(g.t(), h, out=part))


class _OutputLayerLogprobs(torch.autograd.Function):
    """(hidden [N, h], weight [V_shard, h]) -> (logp [N], entropy [N]) in the compute dtype."""

    @staticmethod
    def forward(
        ctx, hidden, weight, targets, temperature, vocab_start, valid, group, world, topk, chunk, need_entropy,
        expected_grad,
    ):  # fmt: skip
        n, cdt, dev = hidden.shape[0], compute_dtype(weight.dtype), hidden.device
        local = targets - vocab_start
        in_shard = (local >= 0) & (local < valid)
        safe_targets = torch.where(in_shard, local, torch.zeros_like(local))
        w = weight[:valid]  # padding rows never take part (their gradient is 0)
        rows = max(1, min(chunk, n))
        # chunk buffers reused across chunks and calls: fresh large allocations cost page faults on CPU
        l_buf = BUFFERS.take((rows, valid), weight.dtype, dev)
        z_buf = l_buf if weight.dtype == cdt else BUFFERS.take((rows, valid), cdt, dev)
        # exp in place of the shifted logits unless the entropy needs both
        e_buf = z_buf if not need_entropy and topk is None else BUFFERS.take((rows, valid), cdt, dev)
        out = {k: torch.empty(n, dtype=cdt, device=dev) for k in ("raw_max", "log_sum", "logp", "entropy")}
        if topk is not None:
            out.update(
                top_thr=torch.empty(n, dtype=cdt, device=dev), top_mass=torch.empty(n, dtype=cdt, device=dev)
            )
        # the gradients for the upstream gradient the caller expects, computed while the logits are here
        early = (
            None
            if expected_grad is None
            else _EarlyGradients(expected_grad, temperature, hidden, weight, valid)
        )
        # the cross-entropy in the weight's dtype: the GEMM's input carries log2(e) / tau, so the logits
        # come out in exp2's units and no pass over the chunk scales them (the [N, h] input is rounded
        # once, at the GEMM's own precision); log-prob and entropy keep the shift-then-scale path
        base2 = early is not None and z_buf is l_buf
        gemm_in = hidden * (LOG2E / temperature) if base2 else hidden
        # on CPU that cross-entropy runs vocabulary-major (vocab_major_chunk: MKL's faster GEMM layout)
        vocab_major = (
            base2
            and dev.type == "cpu"
            and valid > 0
            and chunk * hidden.shape[1] * hidden.element_size() <= VOCAB_MAJOR_BYTES
        )
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            if vocab_major:  # ~10 torch calls per block: without the CPU shim's per-call Python hop
                buf = l_buf.view(-1)[: valid * (sl.stop - start)].view(valid, -1)
                w_target = w[safe_targets[sl]]  # [c, h]: the target's row, for its logit and its gradient
                picked = torch.where(in_shard[sl], (gemm_in[sl] * w_target).sum(dim=-1), 0.0)
                with without_shim_mode():
                    stats, p_scale = vocab_major_chunk(gemm_in[sl], w, buf, picked, temperature, group, world)
                    early.add_vocab_major(
                        sl, buf, p_scale, hidden[sl], w, w_target, safe_targets[sl], in_shard[sl]
                    )
            else:
                src = _chunk_logits(gemm_in[sl], w, l_buf, z_buf)
                picked = src.gather(1, safe_targets[sl].unsqueeze(-1)).squeeze(-1)
                picked = torch.where(in_shard[sl], picked, torch.zeros_like(picked))
                stats = chunk_statistics(
                    src, z_buf, e_buf, picked, temperature, group, world, topk, need_entropy, base2
                )
                if early is not None:
                    early.add_chunk(
                        sl, e_buf, stats.log_sum, hidden[sl], w, l_buf, safe_targets[sl], in_shard[sl]
                    )
            for key, value in vars(stats).items():
                if value is not None:
                    out[key][sl] = value
        BUFFERS.give(l_buf, None if z_buf is l_buf else z_buf, None if e_buf is z_buf else e_buf)
        ctx.save_for_backward(
            hidden, weight, safe_targets, in_shard, out["raw_max"], out["log_sum"], out["entropy"],
            out.get("top_thr"), out.get("top_mass"),
        )  # fmt: skip
        ctx.cfg = (temperature, valid, chunk, need_entropy)
        ctx.early = early
        return out["logp"], out["entropy"]

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, safe_targets, in_shard, raw_max, log_sum, entropy, top_thr, top_mass = (
            ctx.saved_tensors
        )
        temperature, valid, chunk, need_entropy = ctx.cfg
        nones = (None,) * 10
        if ctx.early is not None:
            early, ctx.early = ctx.early, None
            grads = early.scaled(grad_logp, grad_entropy if need_entropy else None)
            if grads is not None:
                return (*grads, *nones)
        n, cdt, dev = hidden.shape[0], compute_dtype(weight.dtype), hidden.device
        grad_hidden = torch.zeros_like(hidden)
        if valid == 0 or n == 0:
            return (grad_hidden, torch.zeros_like(weight), *nones)
        low = weight.dtype != cdt  # bf16/fp16 GEMMs: the gradient chunk is cast, dweight summed in fp32
        grad_logp = torch.zeros(n, dtype=cdt, device=dev) if grad_logp is None else grad_logp.to(cdt)
        if grad_entropy is not None and need_entropy:
            grad_entropy = grad_entropy.to(cdt)
        else:
            grad_entropy = None
        target_grad = torch.where(in_shard, grad_logp, torch.zeros_like(grad_logp))
        w = weight[:valid]
        rows = max(1, min(chunk, n))
        l_buf = BUFFERS.take((rows, valid), weight.dtype, dev)
        z_buf = l_buf if weight.dtype == cdt else BUFFERS.take((rows, valid), cdt, dev)
        g_buf = BUFFERS.take((rows, valid), cdt, dev)
        main_grad = fused_main_grad(weight)
        if main_grad is not None:  # summed straight into megatron's grad buffer
            dw_acc = main_grad[:valid]
        elif low:  # dweight is cast from the fp32 sum after the loop: never held beside it
            dw_acc = torch.zeros(valid, weight.shape[1], dtype=cdt, device=dev)
        else:
            grad_weight = torch.zeros_like(weight)
            dw_acc = grad_weight[:valid]
        # the GEMMs run in the weight's dtype (g is cast to it under bf16): a sum in another goes via a part
        dw_part = (
            BUFFERS.take((valid, weight.shape[1]), weight.dtype, dev)
            if dw_acc.dtype != weight.dtype
            else None
        )
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            h = hidden[sl]
            src = _chunk_logits(h, w, l_buf, z_buf)
            g = chunk_logits_grad(
                src, z_buf, g_buf[: src.shape[0]], raw_max[sl], log_sum[sl], entropy[sl],
                None if top_thr is None else top_thr[sl], None if top_mass is None else top_mass[sl],
                grad_logp[sl], None if grad_entropy is None else grad_entropy[sl],
                safe_targets[sl], target_grad[sl], temperature,
            )  # fmt: skip
            if low:
                g = l_buf[: g.shape[0]].copy_(g)
            torch.mm(g, w, out=grad_hidden[sl])
            add_weight_grad(dw_acc, g, h, dw_part)
        BUFFERS.give(l_buf, None if z_buf is l_buf else z_buf, g_buf, dw_part)
        if main_grad is not None:
            grad_weight = dummy_weight_grad(weight)
        elif low:
            grad_weight = _weight_grad_from(dw_acc, weight)
        return (grad_hidden, grad_weight, *nones)


def _weight_grad_from(dw_acc: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dL/dweight in the weight's dtype and shape from its fp32 sum over the real rows [valid, h];
    the padding rows past them are 0."""
    grad = torch.zeros_like(weight)
    grad[: dw_acc.shape[0]] = dw_acc
    return grad


class _EarlyGradients:
    """dL/dhidden and dL/dweight for an upstream gradient known up to one factor, built in forward.

    A CPT/SFT loss is sum_i w_i * loss_i (w = the loss mask), so dL/dlogp_i = -w_i times whatever
    megatron's schedule seeds backward with (1, or the loss scale). Forward already holds each chunk's
    exp(z - max) and the normaliser, so the gradient needs no pass over the chunk (the target's term
    goes in place, the per-token scale on the GEMMs' small operands) and the two gradient GEMMs follow:
    no logits are recomputed (3 output-layer GEMMs per step instead of 4). Backward checks that the
    gradient it receives is the expected one times a scalar s and returns s times these; any other
    gradient (a different loss, the entropy) falls back to recomputing the chunks.
    Memory held from forward to backward: dL/dhidden [N, h] and dL/dweight [valid, h] in fp32 (+ one
    bf16 GEMM output under bf16/fp16 weights). Under megatron's DDP the latter is a reused buffer that
    backward adds, times s, into main_grad (fused_main_grad); otherwise it is the returned gradient.
    """

    def __init__(self, expected_grad, temperature, hidden, weight, valid):
        cdt, dev = compute_dtype(weight.dtype), weight.device
        self.expected = expected_grad.to(cdt)
        self.coef = self.expected / temperature  # d/dlogits = d/dz / tau
        self.grad_hidden = torch.zeros_like(hidden)
        self.first = True
        self.weight, self.valid = weight, valid  # weight: the shape and dtype of dL/dweight
        self.main_grad = fused_main_grad(weight)
        shape = (valid, weight.shape[1])
        if self.main_grad is not None:  # fp32 sum in a reused buffer, added into main_grad in scaled()
            self.dw, self.grad_weight = BUFFERS.take(shape, cdt, dev), None
        elif weight.dtype != cdt:  # fp32 sum, cast in scaled(): not held beside it through forward
            self.dw, self.grad_weight = torch.empty(shape, dtype=cdt, device=dev), None
        else:
            # the first chunk writes its rows (no zero fill + read of a weight-sized tensor); padding rows 0
            self.grad_weight = torch.empty_like(weight)
            self.grad_weight[valid:] = 0
            self.dw = self.grad_weight[:valid]
        low = weight.dtype != self.dw.dtype
        self.dw_part = BUFFERS.take(shape, weight.dtype, dev) if low else None

    def add_chunk(self, sl, e_buf, log_sum, h, w, l_buf, targets, in_shard):
        """e_buf[:c] = exp((z - max) / tau) of the chunk (overwritten), log_sum [c] float64."""
        c = h.shape[0]
        coef = self.coef[sl]
        # dL/dz_j = coef (1[j = target] - e_j / s) = r (e_j - s 1[j = target]) with r = -coef / s per
        # token: the chunk takes the target's term in place and r goes on the small operands of the
        # two GEMMs (no pass over [c, V] for it)
        s = torch.exp(log_sum)
        scale = (-coef.to(torch.float64) / s).to(coef.dtype).unsqueeze(-1)
        g = e_buf[:c]
        g[torch.arange(c, device=g.device), targets] -= torch.where(in_shard, s.to(g.dtype), 0.0)
        if self.dw_part is None:
            h = h * scale
            torch.mm(g, w, out=self.grad_hidden[sl]).mul_(scale)
        else:  # bf16/fp16 GEMMs: r is applied in the cast to the weight's dtype
            g = torch.mul(g, scale, out=l_buf[:c])
            torch.mm(g, w, out=self.grad_hidden[sl])
        if self.first:  # the first chunk writes dL/dweight: no zero fill
            torch.mm(g.t(), h, out=self.dw if self.dw_part is None else self.dw_part)
            if self.dw_part is not None:
                self.dw.copy_(self.dw_part)
        else:
            add_weight_grad(self.dw, g, h, self.dw_part)
        self.first = False

    def add_vocab_major(self, sl, buf, p_scale, h, w, w_target, targets, in_shard):
        """The chunk's gradients from vocab_major_chunk's buf [valid, c] (overwritten) and p_scale
        [blocks, c], block by block while each block is in the cache; w_target [c, h] the target's rows.

        dL/dlogits_j = coef (1[j = target] - p_j): the -coef p part is buf scaled per block and token,
        feeding both GEMMs; the target's part is one row of w per token into dL/dhidden and one row of
        h per token into dL/dweight."""
        coef = self.coef[sl]
        scale = (p_scale * -coef.to(torch.float64)).to(buf.dtype)
        rows = block_rows(buf.shape[1], buf.dtype)
        grad_hidden = self.grad_hidden[sl]
        for b, start in enumerate(range(0, self.valid, rows)):
            rs = slice(start, start + rows)
            g = buf[rs].mul_(scale[b])
            if b == 0:
                torch.mm(g.t(), w[rs], out=grad_hidden)
            else:
                grad_hidden.addmm_(g.t(), w[rs])
            if self.first:  # the first chunk writes dL/dweight: no zero fill
                torch.mm(g, h, out=self.dw[rs])
            else:
                self.dw[rs].addmm_(g, h)
        on_target = torch.where(in_shard, coef, 0.0).unsqueeze(-1)
        grad_hidden.add_(w_target * on_target)
        self.dw.index_add_(0, targets, h * on_target)
        self.first = False

    def scaled(self, grad_logp, grad_entropy):
        """(s * dL/dhidden, s * dL/dweight) if grad_logp == s * expected and no entropy gradient, else None
        (then the buffers go back and backward recomputes)."""
        s = self._factor(grad_logp, grad_entropy)
        BUFFERS.give(self.dw_part)
        self.dw_part = None
        if s is None:
            if self.main_grad is not None:
                BUFFERS.give(self.dw)
            return None
        if self.main_grad is not None:
            self.main_grad[: self.valid].add_(self.dw, alpha=s)
            BUFFERS.give(self.dw)
            grad_weight = dummy_weight_grad(self.weight)
        elif self.grad_weight is None:  # bf16/fp16: cast from the fp32 sum
            grad_weight = _weight_grad_from(self.dw.mul_(s) if s != 1.0 else self.dw, self.weight)
        else:
            grad_weight = self.grad_weight if s == 1.0 else self.grad_weight.mul_(s)
        self.dw = self.grad_weight = None
        grad_hidden = self.grad_hidden if s == 1.0 else self.grad_hidden.mul_(s)
        return grad_hidden, grad_weight

    def _factor(self, grad_logp, grad_entropy) -> float | None:
        """s with grad_logp == s * expected (and no entropy gradient), else None."""
        if grad_logp is None or (grad_entropy is not None and bool(grad_entropy.ne(0).any())):
            return None
        if self.expected.numel() == 0:
            return None
        grad_logp = grad_logp.to(self.expected.dtype)
        k = self.expected.abs().argmax()
        if self.expected[k] == 0:
            return None
        s = grad_logp[k] / self.expected[k]
        if not torch.allclose(grad_logp, s * self.expected, rtol=1e-6, atol=0):
            return None
        return s.item()


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, l_buf: torch.Tensor, z_buf: torch.Tensor) -> torch.Tensor:
    """h [c, hidden] @ w[valid, hidden]^T into l_buf, in the compute dtype (z_buf when it differs)."""
    c = h.shape[0]
    logits = torch.mm(h, w.t(), out=l_buf[:c])
    if z_buf is l_buf:
        return logits
    return z_buf[:c].copy_(logits)


def output_layer_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    group: Any = None,
    topk_frac: float | None = None,
    need_entropy: bool = True,
    chunk_size: int | None = None,
    expected_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(hidden @ weight^T / tau)[target] and the entropy of softmax(. / tau), chunk by chunk.

    hidden [N, h] (replicated over the TP group), weight [V_shard, h] (rank r holds global rows
    [r * V_shard, (r + 1) * V_shard)), targets [N] global ids. vocab_size: the real vocabulary (rows
    at or above it never take part); None = every row. group: the TP group (None: one process).
    topk_frac: the top-k entropy (see rl.logprobs). need_entropy=False: entropy comes back as zeros
    and costs nothing. chunk_size: tokens per chunk; None = at most CHUNK_BYTES each (CUDA_CHUNK_BYTES on
    a GPU), of equal size.
    expected_grad [N]: dL/dlogp up to one scalar factor, when the caller knows it (a loss weighted by a
    fixed mask); forward then builds the gradients and backward uses them if the gradient it gets is
    that times a scalar (else it recomputes the chunks). Only with need_entropy=False and no topk_frac.
    Returns (logp, entropy), [N] each, fp32 (float64 for a float64 weight), differentiable with
    respect to hidden and weight.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [N, h] and weight {tuple(weight.shape)} [V, h]"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be [N] with N = {hidden.shape[0]}")
    rank, world = group_rank_size(group)
    shard = weight.shape[0]
    vocab_size = shard * world if vocab_size is None else vocab_size
    if not 0 < vocab_size <= shard * world:
        raise ValueError(f"vocab_size {vocab_size} must be in (0, {shard} * {world}] (shard rows x TP size)")
    vocab_start = rank * shard
    valid = max(0, min(shard, vocab_size - vocab_start))
    topk = None if topk_frac is None else (vocab_size, topk_frac, shard)
    chunk = chunk_size or even_chunk(
        hidden.shape[0], chunk_tokens(valid, weight.dtype, device_type=weight.device.type)
    )
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    if expected_grad is not None and (
        need_entropy or topk is not None or valid == 0 or expected_grad.shape != targets.shape
    ):
        raise ValueError("expected_grad needs need_entropy=False, no topk_frac and the targets' shape")
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        expected_grad = None  # nothing will run backward
    return _OutputLayerLogprobs.apply(
        hidden.contiguous(), weight, targets.reshape(-1).long(), float(temperature), vocab_start, valid, group,
        world, topk, int(chunk), need_entropy, expected_grad,
    )  # fmt: skip


def output_layer_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    group: Any = None,
    chunk_size: int | None = None,
    loss_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy [N] (fp32) of labels [N] under softmax(hidden @ weight^T) over every row
    of the (vocab-parallel) weight, as megatron's vocab_parallel_cross_entropy over the output
    layer's logits; never holds [N, V]. loss_weights [N]: the weights the loss will multiply the
    per-token values by (the loss mask); then the gradients are built in forward (no recomputation
    in backward, see output_layer_logprobs' expected_grad). Any loss stays exact either way."""
    expected = None if loss_weights is None else -loss_weights
    logp, _ = output_layer_logprobs(
        hidden, weight, labels, group=group, need_entropy=False, chunk_size=chunk_size, expected_grad=expected
    )
    return -logp


@dataclass
class DeferredOutputLayer:
    """The output layer not yet applied: QwenGPTModel's output for `defer_output_layer=True`.

    hidden [N, h]: the final hidden states of the selected positions, already inside megatron's
    tensor-parallel region (its backward all-reduces their gradient); weight [V_pad / TP, h]: this
    rank's output-layer rows; group: the TP group.
    """

    hidden: torch.Tensor
    weight: torch.Tensor
    group: Any = None

    def logprobs_and_entropy(
        self,
        targets: torch.Tensor,
        temperature: float = 1.0,
        vocab_size: int | None = None,
        topk_frac: float | None = None,
        chunk_size: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """output_layer_logprobs of targets [N]."""
        return output_layer_logprobs(
            self.hidden,
            self.weight,
            targets,
            temperature,
            vocab_size,
            self.group,
            topk_frac,
            chunk_size=chunk_size,
        )

    def logits(self) -> torch.Tensor:
        """The full logits [1, N, V_pad / TP] (tests and debugging: this is the T x V tensor)."""
        return torch.nn.functional.linear(self.hidden, self.weight).unsqueeze(0)
