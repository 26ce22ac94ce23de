"""CPT data: the English / low-resource blend of indexed datasets through megatron.core's dataset builder.

    train_ds, valid_ds = build_cpt_datasets(cfg, train_samples=gbs * iters, valid_samples=...)
    sample = train_ds[i]   # {"tokens", "labels", "loss_mask", "position_ids", "dataset_id"} of [s] tensors
    realised_language_share(train_ds, cfg.data)   # {"en": 0.5, "th": 0.0625, ...} for the log

English gets `data.english_weight` (0.5 by default, SPEC section 2); the other languages of
`data.paths` share the rest in proportion to `data.language_weights` (equal by default).
megatron.core's BlendedMegatronDatasetBuilder builds one GPTDataset per language and a
BlendedDataset that interleaves them so every prefix of the sample order keeps the ratios.
Every training sample holds exactly seq_length tokens, so the sample share is the token share.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from vepo_mcore.config.data import DataConfig
from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.indexed import check_prefix
from vepo_mcore.languages import LANGS
from vepo_mcore.tokenizer import Tokenizer, load_tokenizer

# Imported where used: torch and megatron.core (heavy: seconds to import; the blend arithmetic and split
# checks run without them, and the trainers import this module before they take the save folder's lock).


def language_blend(data: DataConfig) -> dict[str, float]:
    """Normalised sampling weight per language of `data.paths` (languages with weight 0 left out).

    en -> english_weight; every other language -> (1 - english_weight) * w / sum(w) with
    w = language_weights.get(lang, 1.0).
    """
    if not data.paths:
        raise ValueError("data.paths is empty: give language -> indexed dataset prefix for CPT")
    unknown = sorted(set(data.paths) - set(LANGS))
    if unknown:
        raise ValueError(f"data.paths has unknown language(s) {unknown}; known: {', '.join(LANGS)}")
    stray = sorted(set(data.language_weights) - set(data.paths))
    if stray:
        raise ValueError(
            f"data.language_weights has {stray} which data.paths lacks; paths: {sorted(data.paths)}"
        )
    if "en" in data.language_weights:
        raise ValueError("data.language_weights must not contain 'en'; English takes data.english_weight")
    others = {lang: data.language_weights.get(lang, 1.0) for lang in data.paths if lang != "en"}
    total_other = sum(others.values())
    if "en" in data.paths:
        english = data.english_weight if total_other > 0 else 1.0
    elif data.english_weight > 0:
        raise ValueError(
            f"data.english_weight is {data.english_weight} but data.paths has no 'en'; "
            "add an English dataset or set data.english_weight: 0"
        )
    else:
        english = 0.0
    weights = {"en": english} if "en" in data.paths else {}
    for lang, weight in others.items():
        weights[lang] = (1.0 - english) * weight / total_other if total_other else 0.0
    weights = {lang: w for lang, w in weights.items() if w > 0}
    if not weights:
        raise ValueError("every language of data.paths has weight 0")
    return weights


class MegatronTokenizerView:
    """The few tokenizer attributes megatron.core's GPTDataset reads (vocab_size, eod, unique_identifiers).

    No `pad` attribute on purpose: megatron then pads short samples with -1 and masks them,
    instead of reusing the EOD id (our tokenizer's pad) and warning about the collision.
    """

    def __init__(self, tok: Tokenizer):
        self.vocab_size = tok.vocab_size
        self.eod = tok.eod_id
        # Part of megatron's cache key: a different tokenizer never reuses stale sample indices.
        self.unique_identifiers = {
            "class": "vepo_mcore.Tokenizer",
            "path": str(tok.path),
            "vocab": tok.vocab_size,
        }


def gpt_dataset_config(cfg: JobConfig, blend: dict[str, float] | None = None):
    """megatron GPTDatasetConfig for the CPT blend of `cfg` (seed, sequence length, split, cache, masks)."""
    import torch.distributed as dist
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    data = cfg.data
    blend = blend if blend is not None else language_blend(data)
    prefixes = [check_prefix(data.paths[lang]) for lang in blend]
    # One language: no BlendedDataset (megatron warns about blending a single dataset).
    weights = None if len(prefixes) == 1 else list(blend.values())
    # Without torch.distributed megatron's BlendedDataset cannot use a cache dir (it asks for the rank).
    cache = data.cache_dir if dist.is_available() and dist.is_initialized() else None
    return GPTDatasetConfig(
        random_seed=cfg.training.seed,
        sequence_length=cfg.training.seq_length,
        blend=(prefixes, weights),
        split=data.split,
        path_to_cache=cache,
        tokenizer=MegatronTokenizerView(load_tokenizer(cfg.tokenizer.path)),
        reset_position_ids=data.reset_position_ids,
        reset_attention_mask=data.reset_attention_mask,
        eod_mask_loss=data.eod_mask_loss,
        create_attention_mask=data.create_attention_mask,
    )


def build_cpt_datasets(cfg: JobConfig, train_samples: int, valid_samples: int = 0):
    """(train, valid) map-style datasets of the CPT blend; valid is None when the split or count gives
    none (no validation set is built then: training.eval_interval 0, or data.split '100,0,0').

    Call on every rank (megatron's builder is collective when torch.distributed is up: rank 0
    builds and caches the indices, the others load them).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    if train_samples <= 0:
        raise ValueError(f"train_samples must be positive, got {train_samples}")
    config = gpt_dataset_config(cfg)
    if config.split_matrix[1] is None:  # the split gives validation no documents
        valid_samples = 0
    check_splits_fit(cfg, with_valid=valid_samples > 0)
    if valid_samples <= 0:
        # megatron builds every split the split matrix names; without this its valid blend, sized
        # for nothing, can ask a small language for more samples than it has (an IndexError). The
        # train split's bounds stay the same, so its samples do too.
        config.split_matrix = [config.split_matrix[0], None, config.split_matrix[2]]
    _warn_once_about_no_cache()
    sizes = [train_samples, valid_samples, 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return train, (valid if valid_samples > 0 else None)


class _FirstOnly:
    """A logging filter letting the first record of one message through, then none."""

    def __init__(self, text: str):
        self.text, self.seen = text, False

    def filter(self, record) -> bool:
        if self.text not in record.getMessage():
            return True
        seen, self.seen = self.seen, True
        return not seen


_NO_CACHE_FILTER = _FirstOnly("Cannot save the BlendedDataset indexes")


def _warn_once_about_no_cache() -> None:
    """megatron warns 'Cannot save the BlendedDataset indexes' for each blended split it builds without
    data.cache_dir; print it once per process."""
    blended = logging.getLogger("megatron.core.datasets.blended_dataset")
    if _NO_CACHE_FILTER not in blended.filters:
        blended.addFilter(_NO_CACHE_FILTER)


def check_splits_fit(cfg: JobConfig, with_valid: bool) -> None:
    """Every language's train split (and valid split, when validation runs) must hold at least one
    sample of seq_length + 1 tokens; megatron otherwise hangs or fails with an IndexError. Splits are
    cut by documents as megatron cuts them (round(share * documents))."""
    from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data, need = cfg.data, cfg.training.seq_length + 1
    shares = parse_and_normalize_split(data.split)
    bounds = np.cumsum([0.0, *shares])
    used = [("train", 0)] + ([("validation", 1)] if with_valid else [])
    for lang in language_blend(data):
        # A copy, taken while the dataset lives: sequence_lengths views its index's mmap.
        dataset = IndexedDataset(check_prefix(data.paths[lang]))
        lengths = np.array(dataset.sequence_lengths, dtype=np.int64)
        del dataset
        n = len(lengths)
        for name, i in used:
            begin, end = int(round(bounds[i] * n)), int(round(bounds[i + 1] * n))
            tokens = int(lengths[begin:end].sum())
            if tokens >= need:
                continue
            advice = (
                "set training.eval_interval 0 (no validation), give validation a larger share of data.split "
                "(e.g. '90,10,0'), lower training.seq_length, or add documents"
                if name == "validation"
                else "lower training.seq_length, give training a larger share of data.split, or add documents"
            )
            raise ValueError(
                f"data.paths.{lang} ({data.paths[lang]}): its {name} split (data.split '{data.split}' of {n} "
                f"documents = {end - begin} documents, {tokens} tokens) cannot fill one sample of "
                f"training.seq_length + 1 = {need} tokens; {advice}"
            )


def _dataset_languages(dataset, data: DataConfig) -> list[str]:
    """Language of each component of a BlendedDataset (or the one language of a GPTDataset)."""
    by_prefix = {str(prefix): lang for lang, prefix in data.paths.items()}
    parts = dataset.datasets if hasattr(dataset, "dataset_index") else [dataset]
    langs = []
    for part in parts:
        if part.dataset_path not in by_prefix:
            raise ValueError(f"dataset {part.dataset_path} is not one of data.paths {sorted(by_prefix)}")
        langs.append(by_prefix[part.dataset_path])
    return langs


def realised_language_share(dataset, data: DataConfig, num_samples: int | None = None) -> dict[str, float]:
    """Share of the first num_samples samples (all, when None) that each language supplies.

    Reads the BlendedDataset's dataset_index, so it costs nothing to log every run.
    """
    langs = _dataset_languages(dataset, data)
    if not hasattr(dataset, "dataset_index"):
        return {langs[0]: 1.0}
    index = np.asarray(dataset.dataset_index[: num_samples if num_samples is not None else len(dataset)])
    counts = np.bincount(index, minlength=len(langs))
    total = max(int(counts.sum()), 1)
    return {lang: float(c) / total for lang, c in zip(langs, counts)}


def format_share(share: dict[str, float], target: dict[str, float] | None = None) -> str:
    """'en 50.0% (50.0)  th 6.3% (6.2) ...' for a log line."""
    parts: Sequence[str] = [
        f"{lang} {100 * s:.1f}%" + (f" ({100 * target.get(lang, 0.0):.1f})" if target else "")
        for lang, s in share.items()
    ]
    return "  ".join(parts)
