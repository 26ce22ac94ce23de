"""Tokenizer section."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class TokenizerConfig:
    """Which tokenizer to load; None = the Qwen2.5 tokenizer shipped in vepo_mcore/assets."""

    path: str | None = None
    """Tokenizer directory (tokenizer.json + tokenizer_config.json), e.g. an expanded tokenizer."""
