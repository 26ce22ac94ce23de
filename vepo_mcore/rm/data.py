"""Reward-model pairs from FLORES: (better = reference, worse = a corruption of it) per category.

    pairs = build_pairs("dev", tgt_langs=LANGS, lines=range(100), categories=CATEGORIES, seed=0)
    dataset = PairDataset(pairs, tokenizer, seq_length=256)    # item -> {tokens [2, s], last [2], labels [2, 10]}
    batch = collate([dataset[i] for i in idx])                 # better rows first, then worse rows

The RM reads ChatML prompt + response + <|im_end|>, the text the policy produced, and is scored at
that last real token. Sequences longer than seq_length lose their oldest tokens (the response
end, where many errors show, is kept). dev builds training pairs, devtest the held-out test.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from vepo_mcore.eval.directions import Direction
from vepo_mcore.eval.translate import format_prompt
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rl.rewards.corruptions import CATEGORIES, corrupt, label_vector
from vepo_mcore.tokenizer.tokenizer import IM_END


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
) -> list[Pair]:
    """One pair per (line, target language, category); the source language is drawn per (line, target)."""
    from vepo_mcore.tokenizer import load_tokenizer

    tokenizer = tokenizer or load_tokenizer()
    flores = {lang: load_flores(lang, split) for lang in LANGS}
    rng = random.Random(seed)
    pairs = []
    for i in lines:
        for tgt in tgt_langs:
            src = rng.choice([lang for lang in LANGS if lang != tgt])
            source, reference = flores[src][i], flores[tgt][i]
            prompt = format_prompt(Direction(src, tgt), source, tokenizer)
            for category in categories:
                c = corrupt(source, reference, src, tgt, category, seed=seed * 100_003 + i)
                pairs.append(Pair(prompt, reference, c.text, c.categories, category, src, tgt, source))
    return pairs


def encode(tokenizer, prompt: str, response: str, seq_length: int) -> list[int]:
    """Token ids of prompt + response + <|im_end|>, keeping the last seq_length."""
    ids = tokenizer.encode(prompt + response + IM_END)
    return ids[-seq_length:]


def pad(rows: list[list[int]], pad_id: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, length] right-padded, last [n] index of each row's last real token)."""
    length = length or max(len(r) for r in rows)
    tokens = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for k, row in enumerate(rows):
        tokens[k, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens, torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)


class PairDataset:
    """Map-style dataset of encoded pairs: item -> tokens [2, s], last [2], labels [2, 10] (row 0 better)."""

    def __init__(self, pairs: Sequence[Pair], tokenizer, seq_length: int):
        self.pairs, self.tokenizer, self.seq_length = pairs, tokenizer, seq_length

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        p = self.pairs[index % len(self.pairs)]
        rows = [encode(self.tokenizer, p.prompt, text, self.seq_length) for text in (p.better, p.worse)]
        tokens, last = pad(rows, self.tokenizer.eod_id, self.seq_length)
        labels = torch.tensor([[0.0] * len(CATEGORIES), label_vector(p.worse_categories)])
        return {"tokens": tokens, "last": last, "labels": labels}


def collate(items: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """B pair items -> tokens [2B, s], last [2B], labels [2B, 10]: rows 0..B-1 better, B..2B-1 worse."""
    return {
        key: torch.cat([it[key][0:1] for it in items] + [it[key][1:2] for it in items]) for key in items[0]
    }


def micro_batches(
    dataset: PairDataset, pairs_per_micro: int, dp_rank: int = 0, dp_size: int = 1, seed: int = 0
):
    """Endless iterator of collated micro-batches; DP rank r reads every dp_size-th micro-batch of a
    seeded shuffle (epoch by epoch), so ranks see disjoint pairs."""
    if len(dataset) < pairs_per_micro * dp_size:
        raise ValueError(
            f"{len(dataset)} pairs cannot fill one micro-batch of {pairs_per_micro} pairs on each of "
            f"{dp_size} data-parallel ranks (training.micro_batch_size counts pairs)"
        )
    epoch = 0
    while True:
        order = list(range(len(dataset)))
        random.Random(seed + epoch).shuffle(order)
        step = pairs_per_micro * dp_size
        for start in range(0, len(order) - step + 1, step):
            mine = order[start + dp_rank * pairs_per_micro : start + (dp_rank + 1) * pairs_per_micro]
            yield collate([dataset[i] for i in mine])
        epoch += 1
