"""Tokenizer wrapper, ChatML, vocabulary expansion and embedding resize."""

from vepo_mcore.tokenizer.tokenizer import Tokenizer, load_tokenizer

__all__ = ["Tokenizer", "load_tokenizer"]
