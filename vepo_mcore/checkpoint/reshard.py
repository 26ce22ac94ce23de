"""Rewrite a megatron dist checkpoint for another TP/PP layout.

    reshard_checkpoint("ckpt/qwen7b_tp4", "ckpt/qwen7b_tp2pp2", tp=2, pp=2)

torch_dist checkpoints store global tensors, so any checkpoint already *loads* at any layout
(`load_megatron_checkpoint`). Rewriting is for when the files themselves should match a
layout: the vocab rows are re-padded for the new TP (padding rows stay zero) and config.yaml
records the new parallel sizes. Streams like the HF conversion (stream.py): no model is built;
each of the new layout's shards is read as the region it covers of the stored global tensor and
written as it is read, so memory stays near one shard. The result holds the weights only.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from vepo_mcore.checkpoint.convert import (
    HF_CONFIG_FILE,
    TOKENIZER_DIR,
    find_config,
    resolve_checkpoint_dir,
    write_streamed,
)
from vepo_mcore.checkpoint.stream import dist_chunk_source
from vepo_mcore.config import JobConfig, load_config


def reshard_checkpoint(src: str | Path, dst: str | Path, tp: int = 1, pp: int = 1) -> Path:
    """Write `src` (any layout) to `dst` at TP/PP; returns dst.

    Called outside a process group this process writes every rank's shards; called by every rank
    of an existing group of exactly TP*PP processes each rank writes its own."""
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
    if (root / TOKENIZER_DIR).is_dir():
        cfg.tokenizer.path = str((out / TOKENIZER_DIR).resolve())

    def prepare() -> None:
        if (root / HF_CONFIG_FILE).is_file():
            shutil.copyfile(root / HF_CONFIG_FILE, out / HF_CONFIG_FILE)
        if (root / TOKENIZER_DIR).is_dir():
            shutil.copytree(root / TOKENIZER_DIR, out / TOKENIZER_DIR, dirs_exist_ok=True)

    source = dist_chunk_source(resolve_checkpoint_dir(src), cfg)
    return write_streamed(out, cfg, source, prepare, "reshard_checkpoint")
