"""Build a Qwen2.5-architecture megatron.core GPTModel for any TP/PP.

    init_model_parallel(cfg.parallel)
    model = build_model(cfg)            # this rank's pipeline stage, TP-sharded

`transformer_config(cfg)` is the only place our config becomes megatron's TransformerConfig.
The layer spec is Transformer Engine's on GPU (FP8 capable) and megatron's local one on CPU; the GPU
fusions are on where models/fusions.py finds their dependencies.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from vepo_mcore.config.job import JobConfig
from vepo_mcore.models.fp8 import check_fp8_shapes
from vepo_mcore.models.fusions import build_with_fusions, gpu_fusions, log_fusions_off, machine
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.parallel.device import has_cuda

# Imported where used: megatron.core, vepo_mcore.models.attention and vepo_mcore.models.gpt (pull
# megatron.core): heavy, seconds to import; the trainers import this module before they take the save folder's
# lock.


def use_transformer_engine(cfg: JobConfig) -> bool:
    """'auto' = TE when CUDA and transformer_engine are both present."""
    impl = cfg.model.transformer_impl
    te_available = has_cuda() and importlib.util.find_spec("transformer_engine") is not None
    if impl == "transformer_engine" and not te_available:
        raise ValueError(
            "model.transformer_impl is 'transformer_engine' but CUDA or transformer_engine is missing "
            '(install the gpu extra: pip install -e ".[gpu]"), or use model.transformer_impl=local'
        )
    return impl == "transformer_engine" or (impl == "auto" and te_available)


def model_vocab_size(cfg: JobConfig) -> int:
    """Rows of the embedding / output layer in the Megatron model (padded by the one rule)."""
    return padded_vocab_size(
        cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by, cfg.parallel.tensor_model_parallel_size
    )


def params_dtype(cfg: JobConfig) -> torch.dtype:
    return torch.bfloat16 if cfg.training.bf16 else torch.float32


def transformer_config(cfg: JobConfig):
    """Our JobConfig -> megatron.core TransformerConfig (Qwen2.5: RMSNorm, SwiGLU, GQA, qkv bias)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p = cfg.model, cfg.parallel
    on_gpu = has_cuda()
    te = use_transformer_engine(cfg)
    fp8 = {}
    if m.fp8.format is not None:
        if not te:
            raise ValueError("model.fp8.format needs Transformer Engine on a GPU (model.transformer_impl)")
        check_fp8_shapes(cfg)
        fp8 = dict(
            fp8=m.fp8.format,
            fp8_recipe=m.fp8.recipe,
            fp8_margin=m.fp8.margin,
            fp8_amax_history_len=m.fp8.amax_history_len,
            fp8_amax_compute_algo=m.fp8.amax_compute_algo,
        )
    recompute = {}
    if cfg.training.recompute != "none":
        recompute = dict(recompute_granularity=cfg.training.recompute)
    if cfg.training.recompute == "full":
        recompute.update(recompute_method="uniform", recompute_num_layers=1)
    fusions = gpu_fusions(cfg, **machine(), dp_size=1)  # overlap_grad_reduce is wrap_model's
    log_fusions_off(fusions, "gradient_accumulation_fusion", "apply_rope_fusion")
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=m.add_qkv_bias,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        init_method_std=m.init_method_std,
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        sequence_parallel=p.sequence_parallel,
        params_dtype=params_dtype(cfg),
        bf16=cfg.training.bf16,
        pipeline_dtype=params_dtype(cfg),
        use_cpu_initialization=not on_gpu,
        # Fused kernels need CUDA (and TE/apex); the unfused paths compute the same thing.
        bias_activation_fusion=on_gpu and te,
        bias_dropout_fusion=on_gpu and te,
        masked_softmax_fusion=on_gpu and te,
        apply_rope_fusion=fusions.settings["apply_rope_fusion"],
        persist_layer_norm=False,
        gradient_accumulation_fusion=fusions.settings["gradient_accumulation_fusion"],
        **fp8,
        **recompute,
    )


def layer_spec(cfg: JobConfig):
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    from vepo_mcore.models.attention import SDPAttention

    if use_transformer_engine(cfg):
        return get_gpt_layer_with_transformer_engine_spec()
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention  # torch's fused kernel
    return spec


def build_model(
    cfg: JobConfig,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    init_weights: bool = True,
):
    """This rank's GPTModel stage (QwenGPTModel: + `output_mask`, models/gpt.py); megatron parallel
    state must be initialised first.

    Logits come out vocab-parallel ([batch, seq, padded_vocab / TP]) for the fused log-prob path.
    `init_weights=False` allocates without initialising (a checkpoint overwrites every weight):
    megatron's CPU init draws each full layer as an fp32 master copy before sharding it, which
    would triple the peak memory of a conversion.
    """
    from megatron.core import parallel_state

    from vepo_mcore.models.gpt import QwenGPTModel

    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError(
            "build_model needs megatron parallel state: call init_model_parallel(cfg.parallel) first"
        )
    cfg.model.validate(cfg.parallel.tensor_model_parallel_size)
    if pre_process is None:
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=True)
    if post_process is None:
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    config = transformer_config(cfg)
    config.perform_initialization = init_weights
    model = build_with_fusions(
        config,
        lambda: QwenGPTModel(
            config=config,
            transformer_layer_spec=layer_spec(cfg),
            vocab_size=model_vocab_size(cfg),
            max_sequence_length=cfg.model.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,
            share_embeddings_and_output_weights=cfg.model.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=int(cfg.model.rotary_base),
        ),
        apex_grad_fusion=machine()["apex_grad_fusion"],
    )
    if has_cuda():
        model.cuda(torch.cuda.current_device())
    return model
