"""Training data: Megatron indexed datasets (CPT), their language blend, and SFT conversations.

    train, valid = build_datasets(cfg, train_samples, valid_samples)   # by cfg.data.mode

preprocess.py / indexed.py  raw text -> .bin/.idx (tools/preprocess_data.py)
blend.py                    English 0.5 / low-resource 0.5 through megatron's BlendedMegatronDatasetBuilder
sft.py                      ChatML -> ids + assistant-only loss mask, packing, curriculum phases
sft_indexed.py              the same SFT data tokenised on disk (tools/preprocess_sft.py), read memory-mapped
corpus.py, sft_flores.py    the tiny FLORES-dev corpora of the quickstart
megatron.core is imported inside the functions that need it, so importing this package is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config (yaml, dataclasses) is not needed to tokenise: keep the tool's start-up short
    from vepo_mcore.config.job import JobConfig

# Imported where used: vepo_mcore.data.blend (numpy, tokenizers, the config) and vepo_mcore.data.sft_splits
# (pulls torch): every submodule import runs this package first, and the tokenising tool needs neither.


def build_datasets(cfg: JobConfig, train_samples: int, valid_samples: int = 0):
    """(train, valid) map-style datasets for cfg.data.mode; samples are dicts of [s] tensors.

    'cpt': the blended GPTDataset of build_cpt_datasets (train_samples sequences are drawn).
    'sft': the SFTCurriculum (its length is set by the phases; train_samples is not used) and the
    validation set of data.sft_valid_fraction (None when 0).
    """
    if cfg.data.mode == "cpt":
        from vepo_mcore.data.blend import build_cpt_datasets

        return build_cpt_datasets(cfg, train_samples, valid_samples)
    if cfg.data.mode == "sft":
        from vepo_mcore.data.sft_splits import build_sft_splits

        return build_sft_splits(cfg)
    raise ValueError(f"unknown data.mode {cfg.data.mode!r}; known: cpt, sft")
