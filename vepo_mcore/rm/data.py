"""Reward-model pairs from FLORES: (better = reference, worse = a corruption of it) per category.

    pairs = build_pairs("dev", tgt_langs=LANGS, lines=range(100), categories=CATEGORIES, seed=0)
    dataset = PairDataset(pairs, tokenizer, seq_length=256)    # item -> {tokens [2, s], last [2], labels [2, 10]}
    weights = positive_weights(pairs, cap=50.0)                # [10] negatives / positives per category

A PairDataset is a map-style dataset in a seeded shuffled order, so the shared training loop
(training/trainer.py pretrain with its position-based sampler) trains, checkpoints and resumes it
exactly like CPT data; a micro-batch stacks items into [B, 2, s] (rm/loss.py flattens it).

The RM reads ChatML prompt + response + <|im_end|>, the text the policy produced, and is scored at
that last real token. A sequence longer than seq_length keeps the prompt's instruction (its first
paragraph, which names the target language: off-target output is only wrong relative to it) and
the last tokens (the response end, where many errors show); the middle goes. dev builds training
pairs, devtest the held-out test.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.corruptions import CATEGORIES, corrupt, label_vector
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.tokenizer.tokenizer import IM_END
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.prompts import format_prompt


@dataclass(frozen=True)
class Pair:
    prompt: str
    """ChatML prompt ending with the assistant turn opener."""
    better: str
    worse: str
    worse_categories: tuple[str, ...]
    category: str
    """The category the corruption was generated for."""
    src_lang: str
    tgt_lang: str
    source: str = ""
    """The source sentence the prompt asks to translate."""


def build_pairs(
    split: str,
    tgt_langs: Sequence[str] = LANGS,
    lines: Iterable[int] = range(100),
    categories: Sequence[str] = CATEGORIES,
    seed: int = 0,
    tokenizer=None,
    other_language: float = 0.5,
) -> list[Pair]:
    """One pair per (line, target language, category); the source language is drawn per (line, target).

    With probability `other_language` a (line, target)'s off-target corruption is the same FLORES
    line in a third language (neither source nor target); otherwise it copies the source.
    """
    tokenizer = tokenizer or load_tokenizer()
    flores = {lang: load_flores(lang, split) for lang in LANGS}
    rng = random.Random(seed)
    pairs = []
    for i in lines:
        for tgt in tgt_langs:
            src = rng.choice([lang for lang in LANGS if lang != tgt])
            third = rng.choice([lang for lang in LANGS if lang not in (src, tgt)])
            other = (third, flores[third][i]) if rng.random() < other_language else None
            source, reference = flores[src][i], flores[tgt][i]
            prompt = format_prompt(Direction(src, tgt), source, tokenizer)
            for category in categories:
                c = corrupt(source, reference, src, tgt, category, seed=seed * 100_003 + i, other=other)
                pairs.append(Pair(prompt, reference, c.text, c.categories, category, src, tgt, source))
    return pairs


def positive_weights(pairs: Sequence[Pair], cap: float = 50.0) -> torch.Tensor:
    """[10] per category: negatives / positives over the pairs' 2N sequences (references are all
    negative), capped at `cap`; 1 for a category with no positive."""
    positives = torch.tensor([label_vector(p.worse_categories) for p in pairs]).sum(0)
    negatives = 2 * len(pairs) - positives
    return torch.where(positives > 0, negatives / positives.clamp(min=1), torch.ones(())).clamp(max=cap)


def encode(tokenizer, prompt: str, response: str, seq_length: int) -> list[int]:
    """Token ids of prompt + response + <|im_end|>; over seq_length, the instruction (the prompt up
    to its first blank line, when that is at most a quarter of seq_length) plus the last tokens."""
    ids = tokenizer.encode(prompt + response + IM_END)
    if len(ids) <= seq_length:
        return ids
    cut = prompt.find("\n\n")
    head = tokenizer.encode(prompt[: cut + 2]) if cut >= 0 else []
    if not head or len(head) > seq_length // 4 or ids[: len(head)] != head:
        return ids[-seq_length:]
    return head + ids[len(ids) - (seq_length - len(head)) :]


def pad(rows: list[list[int]], pad_id: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, length] right-padded, last [n] index of each row's last real token)."""
    length = length or max(len(r) for r in rows)
    tokens = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for k, row in enumerate(rows):
        tokens[k, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens, torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)


class PairDataset:
    """Map-style dataset of encoded pairs in a seeded shuffled order: item -> tokens [2, s] (row 0
    better, row 1 worse, right-padded to s with eod), last [2], labels [2, 10]."""

    rows_per_sample = 2

    def __init__(self, pairs: Sequence[Pair], tokenizer, seq_length: int, seed: int = 0):
        self.pairs, self.tokenizer, self.seq_length = pairs, tokenizer, seq_length
        self.order = list(range(len(pairs)))
        random.Random(seed).shuffle(self.order)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        p = self.pairs[self.order[index % len(self.pairs)]]
        rows = [encode(self.tokenizer, p.prompt, text, self.seq_length) for text in (p.better, p.worse)]
        tokens, last = pad(rows, self.tokenizer.eod_id, self.seq_length)
        labels = torch.tensor([[0.0] * len(CATEGORIES), label_vector(p.worse_categories)])
        return {"tokens": tokens, "last": last, "labels": labels}
