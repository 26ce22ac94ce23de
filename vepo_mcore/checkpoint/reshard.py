"""Rewrite a megatron dist checkpoint for another TP/PP layout.

    reshard_checkpoint("ckpt/qwen7b_tp4", "ckpt/qwen7b_tp2pp2", tp=2, pp=2)

torch_dist checkpoints store global tensors, so any checkpoint already *loads* at any layout
(`load_megatron_checkpoint`). Rewriting is for when the files themselves should match a
layout: the vocab rows are re-padded for the new TP (padding rows stay zero) and config.yaml
records the new parallel sizes. Works by building the model at the new layout, loading, saving.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch.distributed as dist

from vepo_mcore.checkpoint.convert import (
    CONFIG_FILE,
    HF_CONFIG_FILE,
    LATEST_FILE,
    TOKENIZER_DIR,
    find_config,
    iteration_dir,
    load_megatron_checkpoint,
    local_process_group,
    save_megatron_checkpoint,
    weights_only_common,
)
from vepo_mcore.config import JobConfig, load_config, save_config


def _reshard_rank(rank: int, world_size: int, src: str, dst: str, cfg: JobConfig) -> None:
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    init_model_parallel(cfg.parallel)
    model = build_model(cfg, init_weights=False)
    load_megatron_checkpoint(model, src)
    save_megatron_checkpoint(
        model, iteration_dir(dst, 0), consume_model=True, common=weights_only_common(cfg)
    )


def reshard_checkpoint(src: str | Path, dst: str | Path, tp: int = 1, pp: int = 1) -> Path:
    """Write `src` (any layout) to `dst` at TP/PP; returns dst. Collective inside a TP*PP group."""
    cfg = load_config(JobConfig, find_config(src))
    root = find_config(src).parent
    cfg.parallel = dataclasses.replace(
        cfg.parallel, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    )
    cfg.parallel.validate(tp * pp)
    cfg.model.validate(tp)
    if cfg.model.num_layers % pp:
        raise ValueError(f"model.num_layers ({cfg.model.num_layers}) must be divisible by pipeline size {pp}")
    out = Path(dst)
    world = tp * pp
    in_group = dist.is_initialized() and dist.get_world_size() > 1
    if in_group and dist.get_world_size() != world:
        raise ValueError(
            f"reshard_checkpoint to TP*PP={world} called in a group of {dist.get_world_size()} processes"
        )
    main = not in_group or dist.get_rank() == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)
        if (root / HF_CONFIG_FILE).is_file():
            shutil.copyfile(root / HF_CONFIG_FILE, out / HF_CONFIG_FILE)
        if (root / TOKENIZER_DIR).is_dir():
            shutil.copytree(root / TOKENIZER_DIR, out / TOKENIZER_DIR, dirs_exist_ok=True)
    if (out / TOKENIZER_DIR).is_dir() or (root / TOKENIZER_DIR).is_dir():
        cfg.tokenizer.path = str((out / TOKENIZER_DIR).resolve())
    if in_group:
        dist.barrier()
        _reshard_rank(dist.get_rank(), world, str(src), str(out), cfg)
    elif world == 1:
        with local_process_group():
            _reshard_rank(0, 1, str(src), str(out), cfg)
    else:
        from vepo_mcore.parallel.launch import run_processes

        run_processes(_reshard_rank, world, args=(str(src), str(out), cfg))
    if main:
        save_config(cfg, iteration_dir(out, 0) / CONFIG_FILE)
        save_config(cfg, out / CONFIG_FILE)
        (out / LATEST_FILE).write_text("0\n")
    if in_group:
        dist.barrier()
    return out
