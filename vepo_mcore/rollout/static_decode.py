"""A lean decoder over a megatron GPTModel's own parameters, for the embedded engine on CPU.

    if unsupported_reason(model) is None:                        # else: megatron's own forward
        decoder = StaticCacheDecoder(model, vocab_size)
    logits = decoder.prefill(tokens, key_valid, total_len)       # [b, s] left-padded -> [b, V]
    logits = decoder.decode(next_tokens)                         # [b] -> [b, V]

On CPU a decode step of a small model costs a few GEMMs, and megatron's inference forward spends
most of the step around them (module calls and hooks, a mask and rotary table rebuilt every step,
the key/value heads repeated for GQA). This decoder runs the same math on the same parameter
tensors (never copies: training updates them in place and the next rollout sees them) with a
preallocated key/value cache, one rotary table per batch, grouped-query attention without repeating
heads, and the output layer applied to the last position's hidden state and the real vocabulary
rows only. It covers what the CPU (local) layer spec builds for Qwen2-architecture models on one
model-parallel rank; anything else (TP > 1, PP > 1, Transformer Engine layers, other architectures)
takes megatron's forward: `unsupported_reason` checks every assumption the decoder makes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).

_LAYER_PARAMS = {
    "input_layernorm.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_proj.weight",
    "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc2.weight",
}


class _Layer:
    """One transformer layer's parameter tensors (references, not copies)."""

    def __init__(self, layer):
        attn, mlp = layer.self_attention, layer.mlp
        self.norm_in = layer.input_layernorm.weight
        self.eps_in = layer.input_layernorm.eps
        self.qkv_w = attn.linear_qkv.weight
        self.qkv_b = getattr(attn.linear_qkv, "bias", None)
        self.proj_w = attn.linear_proj.weight
        self.norm_mlp = layer.pre_mlp_layernorm.weight
        self.eps_mlp = layer.pre_mlp_layernorm.eps
        self.fc1_w = mlp.linear_fc1.weight
        self.fc2_w = mlp.linear_fc2.weight


def unsupported_reason(model) -> str | None:
    """Why `model` needs megatron's forward (None: the static-cache decoder computes it exactly)."""
    from megatron.core import parallel_state

    c = model.config
    if parallel_state.get_tensor_model_parallel_world_size() != 1:
        return "tensor parallelism"
    if parallel_state.get_pipeline_model_parallel_world_size() != 1:
        return "pipeline parallelism"
    if not (model.pre_process and model.post_process):
        return "a partial pipeline stage"
    if getattr(model, "position_embedding_type", None) != "rope" or c.rotary_interleaved:
        return "position embeddings other than non-interleaved RoPE"
    checks = {
        "normalization": c.normalization == "RMSNorm" and not c.layernorm_zero_centered_gamma,
        "gated_linear_unit": c.gated_linear_unit and c.activation_func is F.silu,
        "add_bias_linear": not c.add_bias_linear,
        "qk_layernorm": not c.qk_layernorm,
        "multi_latent_attention": not getattr(c, "multi_latent_attention", False),
        "num_moe_experts": not getattr(c, "num_moe_experts", None),
        "apply_residual_connection_post_layernorm": not c.apply_residual_connection_post_layernorm,
        "softmax_scale": getattr(c, "softmax_scale", None) is None,
        "params_dtype": c.params_dtype in (torch.float32, torch.bfloat16),
        "fp16": not c.fp16,
        "fp32_residual_connection": not c.fp32_residual_connection,
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        return f"config fields {failed}"
    for layer in model.decoder.layers:
        names = {n for n, _ in layer.named_parameters()} - {"self_attention.linear_qkv.bias"}
        norms = (layer.input_layernorm, layer.pre_mlp_layernorm)
        if names != _LAYER_PARAMS or not all(isinstance(n, torch.nn.RMSNorm) for n in norms):
            return "a layer spec other than megatron's local one"  # e.g. Transformer Engine's fused norms
    if not isinstance(model.decoder.final_layernorm, torch.nn.RMSNorm):
        return "a final norm other than torch's RMSNorm"
    return None


class StaticCacheDecoder:
    """Prefill + one-token decode steps with a preallocated KV cache, batch-first, in the parameters'
    dtype (fp32, or bf16 as training leaves it: each op as megatron's, so bf16 rounds alike)."""

    def __init__(self, model, vocab_size: int):
        c = model.config
        self.model = model
        self.vocab_size = vocab_size
        self.heads = c.num_attention_heads
        self.groups = c.num_query_groups or c.num_attention_heads
        self.head_dim = c.kv_channels
        self.layers = [_Layer(layer) for layer in model.decoder.layers]
        self.embedding = model.embedding.word_embeddings.weight
        final = model.decoder.final_layernorm
        self.norm_out, self.eps_out = final.weight, final.eps
        out = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
        # [h, V] contiguous, real rows only: a copy (refreshed every batch, as training changes the
        # weights), but at a few rows per step a row-major weight's GEMM runs ~15% faster on CPU
        self.output_t = (out if out is not None else model.output_layer.weight)[:vocab_size].t().contiguous()
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._length = 0

    # ------------------------------------------------------------------ steps

    def prefill(self, tokens: torch.Tensor, key_valid: torch.Tensor, total_len: int) -> torch.Tensor:
        """Left-padded prompts [b, s] and the non-padding keys [b, total_len] -> last-position logits [b, V].

        Allocates the cache for `total_len` positions. A padding query attends to itself only (its
        row would otherwise be empty); no real query ever attends to a padding key.
        """
        b, s = tokens.shape
        g, d = self.groups, self.head_dim
        dtype, dev = self.embedding.dtype, self.embedding.device
        self._cache = [
            tuple(torch.empty(b, g, total_len, d, dtype=dtype, device=dev) for _ in "kv") for _ in self.layers
        ]
        freqs = self.model.rotary_pos_emb(total_len)  # megatron's own table: [total, 1, 1, d]
        self._cos = torch.cos(freqs).view(total_len, d).to(dtype)
        self._sin = torch.sin(freqs).view(total_len, d).to(dtype)
        self._key_valid = key_valid = key_valid.to(dev)
        allowed = torch.ones(s, s, dtype=torch.bool, device=dev).tril_() & key_valid[:, None, None, :s]
        allowed |= torch.eye(s, dtype=torch.bool, device=dev)
        self._length = 0
        return self._forward(tokens.to(dev), allowed)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """The next token of every row [b] -> logits [b, V] for the position after it."""
        t = self._length + 1
        return self._forward(tokens.to(self.embedding.device)[:, None], self._key_valid[:, None, None, :t])

    # ------------------------------------------------------------------ the model

    def _forward(self, tokens: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """tokens [b, s] at positions length..length+s-1; allowed [b or 1, 1, s, t] -> logits [b, V]."""
        b, s = tokens.shape
        start, end = self._length, self._length + s
        heads, g, d = self.heads, self.groups, self.head_dim
        per_group = heads // g
        cos, sin = self._cos[start:end, None, None], self._sin[start:end, None, None]
        # [b, 1, per_group * s, end]: the same rows for every query head of a group
        mask = allowed.expand(-1, per_group, -1, -1).reshape(allowed.shape[0], 1, per_group * s, end)
        x = F.embedding(tokens, self.embedding)
        for layer, (k_cache, v_cache) in zip(self.layers, self._cache):
            h = F.rms_norm(x, (x.shape[-1],), layer.norm_in, layer.eps_in)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b).view(b, s, g, per_group + 2, d)
            # rotate the group's queries and its key in one go: [b, s, g, per_group + 1, d]
            qk = _rope(qkv[:, :, :, : per_group + 1], cos, sin)
            k_cache[:, :, start:end] = qk[:, :, :, per_group].transpose(1, 2)
            v_cache[:, :, start:end] = qkv[:, :, :, per_group + 1].transpose(1, 2)
            # a group's queries as one longer query sequence against its single key/value head
            q = qk[:, :, :, :per_group].permute(0, 2, 3, 1, 4).reshape(b, g, per_group * s, d)
            attn = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask)
            attn = attn.view(b, g, per_group, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, heads * d)
            x = x + F.linear(attn, layer.proj_w)
            h = F.rms_norm(x, (x.shape[-1],), layer.norm_mlp, layer.eps_mlp)
            gate, up = F.linear(h, layer.fc1_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.fc2_w)
        self._length = end
        last = F.rms_norm(x[:, -1], (x.shape[-1],), self.norm_out, self.eps_out)
        return torch.mm(last, self.output_t)


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Non-interleaved rotary embedding (megatron's and Qwen2's): t * cos + rotate_half(t) * sin."""
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rotated * sin
