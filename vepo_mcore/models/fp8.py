"""The shapes FP8 GEMMs accept, checked before Transformer Engine sees them.

Transformer Engine 2.x runs a GEMM in FP8 only when its operands are aligned: for an input of
shape [..., K], the product of the leading dims must be a multiple of 8 and K a multiple of 16
(transformer_engine/pytorch/utils.py, `assert_dim_for_fp8_exec`). The weight-gradient GEMM takes
the token dimension as its inner dimension, so in training the tokens of a micro-batch (per TP rank
under sequence parallelism) must be a multiple of 16 as well. Megatron-LM pads packed FP8
sequences the same way. A misaligned shape fails deep inside TE with an assertion; here it fails at
build time naming the setting, and variable-length RL batches are padded to `token_multiple`.
"""

from __future__ import annotations

from vepo_mcore.config.job import JobConfig

FP8_ALIGN = 16
"""Every FP8 GEMM dimension this project controls is padded or checked to a multiple of this."""


def token_multiple(cfg: JobConfig) -> int:
    """What a micro-batch's sequence length is padded to: 1 without FP8; 16, or 16 x TP when the
    sequence dimension is split over the tensor-parallel ranks (sequence parallelism)."""
    if cfg.model.fp8.format is None:
        return 1
    tp = cfg.parallel.tensor_model_parallel_size
    return FP8_ALIGN * (tp if cfg.parallel.sequence_parallel else 1)


def fp8_shape_errors(cfg: JobConfig) -> list[str]:
    """Every setting that gives an FP8 GEMM a dimension TE refuses ([] when FP8 is off or all fit)."""
    if cfg.model.fp8.format is None:
        return []
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    qkv = (m.num_attention_heads + 2 * m.num_query_groups) * m.head_dim
    widths = {
        "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size / TP": m.ffn_hidden_size // tp,
        "attention projection width (num_attention_heads * head_dim) / TP": m.num_attention_heads
        * m.head_dim
        // tp,
        "QKV width ((num_attention_heads + 2 * num_query_groups) * head_dim) / TP": qkv // tp,
    }
    errors = [f"{name} = {value}" for name, value in widths.items() if value % FP8_ALIGN]
    tokens = cfg.training.micro_batch_size * cfg.training.seq_length
    if tokens % token_multiple(cfg):
        errors.append(
            f"training.micro_batch_size * training.seq_length = {tokens} (needs a multiple of "
            f"{token_multiple(cfg)}{' with sequence parallelism' if cfg.parallel.sequence_parallel else ''})"
        )
    return errors


def check_fp8_shapes(cfg: JobConfig) -> None:
    """Raise naming every misaligned setting when model.fp8.format is set."""
    errors = fp8_shape_errors(cfg)
    if errors:
        raise ValueError(
            f"model.fp8.format={cfg.model.fp8.format!r} needs every FP8 GEMM dimension to be a multiple of "
            f"{FP8_ALIGN} (Transformer Engine refuses others); change: " + "; ".join(errors)
        )
