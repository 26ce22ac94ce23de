"""Eval section: FLORES-200 evaluation defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class EvalConfig:
    """FLORES-200 evaluation."""

    directions: str = "all"
    """Comma list of src-tgt pairs, or groups x2e/e2x/x2x, or 'all' (90 directions)."""
    split: str = "devtest"
    """FLORES split."""
    max_sentences: int | None = None
    """Truncate each direction for quick runs."""
    comet_checkpoint: str | None = None
    """Path to a COMET-22 checkpoint; None skips COMET."""
    spm_model: str | None = None
    """flores200 sentencepiece model for spBLEU; None = per-language sacreBLEU tokenizers."""
