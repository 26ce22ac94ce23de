"""The core attention of the local (CPU) layer spec: megatron's DotProductAttention, computed by torch's
fused scaled_dot_product_attention where it can be.

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention

megatron's local DotProductAttention materialises the [b, heads, s, s] scores (baddbmm, mask fill,
softmax, bmm: four passes over them, and four more in backward) and repeats the key/value heads for
grouped-query attention. torch's SDPA does the same arithmetic in one fused CPU kernel with the
groups broadcast (one layer's attention forward + backward, 4 heads / 2 groups of 64: 1.3-1.7x
faster at 1 x 512 and 8 x 256 tokens, outputs within 1e-6 in fp32; the train step 2-3% faster,
benchmarks/train_step.py, 2026-11-27). It is what transformers' Qwen2 runs on CPU too. The Transformer
Engine spec (GPU) does not use this module.

The same inputs and masks as megatron's: query [sq, b, np, hn], key/value [sk, b, ng, hn], an optional
boolean attention_mask [b or 1, 1, sq, sk] with True = masked out; no mask means causal for a causal
layer. Anything SDPA cannot express the same way falls back to megatron's own forward: packed
(THD) sequences, an attention bias, a softmax offset, sliding windows, query-key layer scaling,
sq != sk (a KV cache) and attention dropout while training (megatron draws it from its RNG tracker).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPAttention(DotProductAttention):
    """DotProductAttention through F.scaled_dot_product_attention (same signature and results)."""

    def _fused(self, query: torch.Tensor, key: torch.Tensor, packed_seq_params, attention_bias) -> bool:
        dropout = self.attention_dropout.p if self.training else 0.0
        return (
            packed_seq_params is None
            and attention_bias is None
            and self.softmax_offset is None
            and self.scale_mask_softmax.window_size is None
            and not self.config.apply_query_key_layer_scaling
            and query.shape[0] == key.shape[0]
            and dropout == 0.0
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        """[sq, b, np, hn] queries, [sk, b, ng, hn] keys and values -> context [sq, b, np * hn]."""
        if not self._fused(query, key, packed_seq_params, attention_bias):
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        sq, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
        causal = attention_mask is None and self.attn_mask_type == AttnMaskType.causal
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=None if attention_mask is None else ~attention_mask,  # SDPA: True = attends
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=self.num_attention_heads_per_partition != self.num_query_groups_per_partition,
        )
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
