"""Qwen2.5 GPTModel builder (TE spec on GPU, local on CPU) and the vocab padding rule."""

from vepo_mcore.models.vocab import padded_vocab_size

__all__ = ["padded_vocab_size"]
