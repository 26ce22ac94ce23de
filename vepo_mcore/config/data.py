"""Data section: CPT blends of Megatron indexed datasets and SFT conversation phases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from vepo_mcore.languages import LANGS


@dataclass(kw_only=True)
class SFTPhaseConfig:
    """One curriculum phase of SFT: its own blend and sample budget."""

    name: str = "phase"
    """Phase name for logs."""
    paths: dict[str, str] = field(default_factory=dict)
    """Source name -> jsonl file of ChatML conversations (tokenised at start-up), or the output prefix
    of tools/preprocess_sft.py (read memory-mapped: millions of conversations)."""
    weights: dict[str, float] = field(default_factory=dict)
    """Source name -> sampling weight (missing = equal)."""
    num_samples: int = 0
    """Conversations drawn in this phase by weight, sources cycled as needed (0 = every
    conversation of every source once, weights ignored). Packing turns them into fewer sequences."""


@dataclass(kw_only=True)
class DataConfig:
    """Where training data comes from and how it is blended."""

    mode: Literal["cpt", "sft"] = "cpt"
    """'cpt' = indexed token datasets; 'sft' = ChatML conversations with assistant-only loss."""
    paths: dict[str, str] = field(default_factory=dict)
    """CPT: language -> Megatron indexed dataset prefix (without .bin/.idx)."""
    english_weight: float = 0.5
    """CPT: share of English ('en' key) in the blend; the low-resource languages share the rest."""
    language_weights: dict[str, float] = field(default_factory=dict)
    """CPT: relative weights among non-English languages (missing = equal)."""
    split: str = "98,2,0"
    """Train/valid/test split of each dataset in per-mille-style ratios."""
    cache_dir: str | None = None
    """Where megatron.core writes dataset index caches (None = next to the data). Used when
    torch.distributed is initialised; a single process without it keeps the blend index in memory.
    SFT sources on disk: where the sample plans are cached (None = sft_plan_cache/ beside the first source)."""
    reset_position_ids: bool = False
    """CPT: restart position ids after every EOD (megatron GPTDatasetConfig.reset_position_ids)."""
    reset_attention_mask: bool = False
    """CPT: block attention across EOD boundaries (needs create_attention_mask)."""
    eod_mask_loss: bool = False
    """CPT: no loss on predicting the EOD token."""
    create_attention_mask: bool = False
    """Put an explicit [1, s, s] attention mask in each sample. Off: the attention kernel applies
    the causal mask itself (cheaper). SFT packing always needs a per-conversation mask or
    segment ids; see sft_attention_mask."""
    sft_phases: list[SFTPhaseConfig] = field(default_factory=list)
    """SFT: curriculum phases run in order."""
    sft_packing: bool = True
    """SFT: pack conversations into sequences (attention kept per conversation) instead of padding."""
    sft_attention_mask: bool = True
    """SFT: put a block-diagonal causal [1, s, s] mask (True = masked out, megatron's convention)
    in each sample so packed conversations never attend to each other. Off: only `segment_ids`
    (conversation index per token, -1 on padding) is given, e.g. for TE's packed-sequence path."""
    sft_valid_fraction: float = 0.0
    """SFT: share of every source's conversations held out (seeded by training.seed) as the validation
    set that training.eval_interval evaluates; 0 = no validation set."""
    num_workers: int = 0
    """DataLoader workers."""

    def validate(self) -> None:
        if not 0.0 <= self.english_weight <= 1.0:
            raise ValueError(f"data.english_weight must be in [0, 1], got {self.english_weight}")
        for lang, weight in self.language_weights.items():
            if weight < 0:
                raise ValueError(f"data.language_weights.{lang} must be >= 0, got {weight}")
        if self.mode == "cpt" and self.paths:
            unknown = sorted(set(self.paths) - set(LANGS))
            if unknown:
                raise ValueError(f"data.paths has unknown language(s) {unknown}; known: {', '.join(LANGS)}")
            stray = sorted(set(self.language_weights) - (set(self.paths) - {"en"}))
            if stray:
                raise ValueError(
                    f"data.language_weights has {stray}: not a non-English language of data.paths "
                    "(English takes data.english_weight)"
                )
            if "en" not in self.paths and self.english_weight > 0:
                raise ValueError(
                    f"data.english_weight is {self.english_weight} but data.paths has no 'en'; "
                    "add an English dataset or set data.english_weight: 0"
                )
        if self.reset_attention_mask and not self.create_attention_mask:
            raise ValueError("data.reset_attention_mask needs data.create_attention_mask: true")
        if not 0.0 <= self.sft_valid_fraction < 1.0:
            raise ValueError(f"data.sft_valid_fraction must be in [0, 1), got {self.sft_valid_fraction}")
        for i, phase in enumerate(self.sft_phases):
            if phase.num_samples < 0:
                raise ValueError(f"data.sft_phases[{i}].num_samples must be >= 0, got {phase.num_samples}")
            for source, weight in phase.weights.items():
                if source not in phase.paths:
                    raise ValueError(
                        f"data.sft_phases[{i}].weights.{source}: no such source; sources: {sorted(phase.paths)}"
                    )
                if weight < 0:
                    raise ValueError(f"data.sft_phases[{i}].weights.{source} must be >= 0, got {weight}")
