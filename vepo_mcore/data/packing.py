"""Packed SFT micro-batches in the THD layout that Transformer Engine's attention takes.

    batch, params = to_thd(batch, multiple)     # [b, s] fields -> [1, T]; params: megatron PackedSeqParams
    output = model(batch["tokens"], batch["position_ids"], None, labels=..., packed_seq_params=params)

On the local spec (CPU) packed conversations are kept apart by the block-diagonal [b, 1, s, s]
mask of data/sft.py. Transformer Engine's fused attention builds no dense mask (its causal kernel
ignores one), so there the packed micro-batch goes in as Megatron-LM's SFT hands it over
(pretrain_gpt.get_batch -> megatron.core.utils.get_thd_batch_on_this_cp_rank): the tokens laid
end to end as one row, and `PackedSeqParams(qkv_format="thd", cu_seqlens_q/kv, max_seqlen_q/kv)`
saying where each conversation starts. Megatron-LM packs one row per micro-batch; here the b rows
of a micro-batch are laid end to end as well (every row start begins a sequence), so
training.micro_batch_size keeps its meaning. RoPE restarts per sequence from cu_seqlens (megatron
applies it per THD sequence), as the restarted position ids do on the local spec.

The token count T is padded to `thd_token_multiple` (FP8 GEMMs take multiples of 16, and
sequence parallelism splits T over the TP ranks); the padding is one more sequence of its own,
with loss mask 0. Megatron's pipeline schedules size the tensors they pass between stages from
`schedule_shape`: [T, 1, hidden] under THD instead of [s, b, hidden].
"""

from __future__ import annotations

import weakref

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.sft import cu_seqlens
from vepo_mcore.models.builder import use_transformer_engine
from vepo_mcore.models.fp8 import FP8_ALIGN

THD_KEYS = ("tokens", "labels", "loss_mask", "position_ids")
"""The per-token fields laid out as [1, T]; anything else [b, s]-shaped (segment_ids, the dense
mask) is dropped: cu_seqlens carries what they said."""


def thd_token_multiple(fp8: bool, tensor_parallel: int, sequence_parallel: bool) -> int:
    """What the THD token count is padded to: 16 under FP8 (TE's GEMM alignment, models/fp8.py),
    times TP under sequence parallelism (each TP rank takes T / TP tokens)."""
    split = tensor_parallel if sequence_parallel else 1
    return (FP8_ALIGN if fp8 else 1) * split


def thd_packing(cfg: JobConfig) -> bool:
    """Whether this run's packed SFT goes to the model as THD (packing on, Transformer Engine spec)."""
    return cfg.data.mode == "sft" and cfg.data.sft_packing and use_transformer_engine(cfg)


def schedule_shape(cfg: JobConfig, rows_per_sample: int = 1) -> tuple[int, int]:
    """(seq_length, micro_batch_size) for megatron's forward-backward schedules (their p2p tensors
    between pipeline stages are [seq_length, micro_batch_size, hidden])."""
    t, p = cfg.training, cfg.parallel
    if not thd_packing(cfg):
        return t.seq_length, rows_per_sample * t.micro_batch_size
    multiple = thd_token_multiple(
        cfg.model.fp8.format is not None, p.tensor_model_parallel_size, p.sequence_parallel
    )
    tokens = rows_per_sample * t.micro_batch_size * t.seq_length
    return -(-tokens // multiple) * multiple, 1


def packed_seq_params(segment_ids: torch.Tensor, multiple: int = 1) -> PackedSeqParams:
    """segment_ids [b, s] (conversation index per token, -1 on padding) -> the THD PackedSeqParams of
    the b*s tokens laid end to end, padded to a multiple of `multiple`.

    cu_seqlens: int32 on the tokens' device, 0 first, one entry per sequence start (every row start
    and every change of segment id), T last. max_seqlen: the longest sequence, a Python int (TE
    sizes its kernels from it; megatron sizes the rotary table from it).
    """
    if segment_ids.dim() != 2:
        raise ValueError(f"segment_ids must be [b, s], got shape {tuple(segment_ids.shape)}")
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    cu = cu_seqlens(segment_ids)
    tokens = segment_ids.numel()
    padded = -(-tokens // multiple) * multiple
    if padded > tokens:
        cu = torch.cat([cu, torch.tensor([padded], dtype=torch.int32, device=cu.device)])
    max_seqlen = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
    )


def to_thd(
    batch: dict[str, torch.Tensor], multiple: int = 1
) -> tuple[dict[str, torch.Tensor], PackedSeqParams]:
    """A packed micro-batch of [b, s] fields (with `segment_ids`) -> ([1, T] fields, PackedSeqParams).

    T = b*s padded to `multiple`: padding tokens are id 0 with loss mask 0, their positions counting
    on from 0. `attention_mask` and `segment_ids` are not in the result (cu_seqlens replaces them).
    """
    if "segment_ids" not in batch:
        raise ValueError(f"a THD micro-batch needs 'segment_ids' [b, s]; got keys {sorted(batch)}")
    segments = batch["segment_ids"]
    params = packed_seq_params(segments, multiple)
    tokens, padded = segments.numel(), int(params.cu_seqlens_q[-1])
    out = {}
    for key in THD_KEYS:
        if key not in batch:
            continue
        flat = batch[key].reshape(1, -1)
        if flat.shape[1] != tokens:
            raise ValueError(f"batch[{key!r}] has {flat.shape[1]} tokens, segment_ids {tokens}")
        if padded > tokens:
            fill = torch.zeros(1, padded - tokens, dtype=flat.dtype, device=flat.device)
            if key == "position_ids":
                fill = torch.arange(padded - tokens, dtype=flat.dtype, device=flat.device).unsqueeze(0)
            flat = torch.cat([flat, fill], dim=1)
        out[key] = flat
    return out, params


_TE_ATTENTION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attention_takes_thd(model: torch.nn.Module) -> bool:
    """Whether the model's core attention is Transformer Engine's (megatron's TEDotProductAttention,
    which takes packed_seq_params; the local DotProductAttention refuses them). Looked up once per model."""
    if model not in _TE_ATTENTION:
        _TE_ATTENTION[model] = any(
            cls.__name__ == "TEDotProductAttention"
            for module in model.modules()
            for cls in type(module).__mro__
        )
    return _TE_ATTENTION[model]
