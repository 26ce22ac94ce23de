"""Tiny random Qwen2 checkpoints and a TP/PP megatron forward, for conversion tests and checks.

tiny_qwen2_hf(tmp / "hf", tie=True, vocab_size=320)       # transformers save_pretrained
run_processes(megatron_logits_worker, 2, args=(ckpt, tokens, out_file, tp, pp))
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist


def tiny_qwen2_hf(
    out_dir: str | Path,
    *,
    tie: bool = False,
    vocab_size: int = 320,
    num_layers: int = 4,
    qkv_bias: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    max_shard_size: str | None = None,
):
    """Save a random Qwen2ForCausalLM (hidden 64, 4 heads / 2 kv heads) and return the model.

    qkv_bias=False zeroes the q/k/v biases and drops them from the saved file, the way a
    Qwen2-architecture checkpoint without attention biases looks on disk.
    """
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        use_sliding_window=False,
    )
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Random norms and biases (init leaves them at 1 / 0), so mapping mistakes show in logits.
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(torch.zeros_like(param) if not qkv_bias else 0.1 * torch.randn_like(param))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if not qkv_bias:
        path = Path(out_dir) / "model.safetensors"
        tensors = {k: v for k, v in load_file(path).items() if not k.endswith("_proj.bias")}
        save_file(tensors, path, metadata={"format": "pt"})
    return model


def megatron_forward(model, tokens: torch.Tensor) -> torch.Tensor | None:
    """Full-vocab logits [b, s, padded_vocab] of `tokens` [b, s] through this rank's TP/PP model.

    Collective over the model-parallel group; returns the logits on every rank of the last
    pipeline stage and None elsewhere. Pipeline stages pass hidden states [s, b, h] with send/recv.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    b, s = tokens.shape
    dev = next(model.parameters()).device  # the model's device (CUDA when a GPU is present)
    tokens = tokens.to(dev)
    position_ids = torch.arange(s, device=dev).unsqueeze(0).expand(b, s)
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    hidden_size = model.config.hidden_size
    with torch.no_grad():
        if not first:
            hidden = torch.empty(s, b, hidden_size, dtype=model.config.params_dtype, device=dev)
            dist.recv(hidden, src=parallel_state.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
        out = model(tokens, position_ids, None)
        if not last:
            dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
            return None
        return gather_from_tensor_model_parallel_region(out)


def megatron_logits_worker(
    rank: int, world_size: int, ckpt_dir: str, tokens, out_file: str, tp: int, pp: int
):
    """run_processes body: build at TP/PP from the checkpoint's config, load, forward, save logits."""
    from megatron.core import parallel_state

    from vepo_mcore.checkpoint.convert import find_config, load_megatron_checkpoint
    from vepo_mcore.config import JobConfig, ParallelConfig, load_config
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg = load_config(JobConfig, find_config(ckpt_dir))
    cfg.parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    init_model_parallel(cfg.parallel)
    model = build_model(cfg).eval()
    load_megatron_checkpoint(model, ckpt_dir)
    logits = megatron_forward(model, tokens)
    if logits is not None and parallel_state.get_tensor_model_parallel_rank() == 0:
        torch.save(logits, out_file)
