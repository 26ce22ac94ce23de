"""The SFT datasets of a run: `.jsonl` sources tokenised in memory (data/sft.py) or prefixes of
tools/preprocess_sft.py read memory-mapped (data/sft_indexed.py), with the same samples either way.

    curriculum, valid = build_sft_splits(cfg)
"""

from __future__ import annotations

import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.sft import SFTCurriculum, build_memory_sft, is_jsonl
from vepo_mcore.data.sft_indexed import build_indexed_sft


def build_sft_splits(cfg: JobConfig) -> tuple[SFTCurriculum, torch.utils.data.Dataset | None]:
    """(curriculum, validation set or None) of cfg.data.sft_phases at cfg.training.seq_length, the same
    on every rank. A run uses one kind of source: all `.jsonl` files or all indexed prefixes."""
    on_disk = [not is_jsonl(path) for phase in cfg.data.sft_phases for path in phase.paths.values()]
    if not any(on_disk):
        return build_memory_sft(cfg)
    if not all(on_disk):
        raise ValueError(
            "data.sft_phases mixes .jsonl files and indexed prefixes; preprocess the jsonl sources with "
            "tools/preprocess_sft.py and give their prefixes"
        )
    return build_indexed_sft(cfg)


def build_sft_datasets(cfg: JobConfig) -> SFTCurriculum:
    """The training curriculum of cfg.data.sft_phases (see build_sft_splits)."""
    return build_sft_splits(cfg)[0]
