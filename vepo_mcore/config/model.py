"""Model section: the shape of a Qwen2.5-architecture GPT model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class FP8Config:
    """FP8 training through Transformer Engine (GPU only; ignored with the local CPU spec)."""

    format: Literal["e4m3", "hybrid"] | None = None
    """None disables FP8. 'hybrid' = e4m3 forward, e5m2 backward (the usual training choice)."""
    recipe: Literal["delayed", "tensorwise"] = "delayed"
    """'delayed' = DelayedScaling with an amax history; 'tensorwise' = current (per-tensor) scaling."""
    amax_history_len: int = 1024
    """Length of the amax history window for delayed scaling."""
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    """How the scale is derived from the amax history."""
    margin: int = 0
    """Scaling factor margin (power of two) for delayed scaling."""


@dataclass(kw_only=True)
class ModelConfig:
    """Qwen2.5 architecture: RMSNorm, SwiGLU, RoPE, GQA with qkv bias."""

    num_layers: int = 2
    """Number of transformer layers."""
    hidden_size: int = 64
    """Model width."""
    ffn_hidden_size: int = 176
    """SwiGLU intermediate size (per branch)."""
    num_attention_heads: int = 4
    """Query heads."""
    num_query_groups: int = 2
    """Key/value heads (GQA groups)."""
    kv_channels: int | None = None
    """Head dimension; None = hidden_size // num_attention_heads."""
    vocab_size: int = 151665
    """Real token ids (the tokenizer's length). The embedding is padded by the one padding rule."""
    make_vocab_size_divisible_by: int = 128
    """Pad the vocab to a multiple of this times the tensor-parallel size."""
    max_position_embeddings: int = 32768
    """Longest sequence the RoPE tables are built for."""
    rotary_base: float = 1_000_000.0
    """RoPE theta."""
    norm_epsilon: float = 1e-6
    """RMSNorm epsilon."""
    add_qkv_bias: bool = True
    """Qwen2 has biases on q/k/v projections only."""
    tie_word_embeddings: bool = False
    """Share input embedding and output layer (Qwen2.5-0.5B/1.5B do; 7B does not)."""
    init_method_std: float = 0.02
    """Std of the normal weight init (random-init models only)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    hidden_dropout: float = 0.0
    """Dropout on residual branches."""
    transformer_impl: Literal["auto", "local", "transformer_engine"] = "auto"
    """Layer spec: 'auto' picks Transformer Engine when CUDA and TE are present, else local."""
    fp8: FP8Config = field(default_factory=FP8Config)
    """FP8 recipe (Transformer Engine only)."""

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def validate(self, tensor_parallel: int = 1) -> None:
        positive = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"model.vocab_size must be at least 2, got {self.vocab_size}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_attention_heads "
                f"({self.num_attention_heads}) unless model.kv_channels is set"
            )
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"model.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"model.num_query_groups ({self.num_query_groups})"
            )
        if self.num_attention_heads % tensor_parallel:
            raise ValueError(
                f"model.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"parallel.tensor_model_parallel_size ({tensor_parallel})"
            )
        if self.num_query_groups % tensor_parallel:
            raise ValueError(
                f"model.num_query_groups ({self.num_query_groups}) must be divisible by "
                f"parallel.tensor_model_parallel_size ({tensor_parallel})"
            )
        if self.ffn_hidden_size % tensor_parallel:
            raise ValueError(
                f"model.ffn_hidden_size ({self.ffn_hidden_size}) must be divisible by "
                f"parallel.tensor_model_parallel_size ({tensor_parallel})"
            )
        if self.make_vocab_size_divisible_by <= 0:
            raise ValueError("model.make_vocab_size_divisible_by must be positive")
