"""A deterministic random-token dataset in GPTDataset's sample format (tests, smoke runs, benchmarks)."""

from __future__ import annotations

import torch


class SyntheticTokens:
    """`num_samples` random sequences; sample i = {tokens, labels, loss_mask, position_ids} of length s.

    `masked_prefix=True` zeroes the loss mask on a random-length prefix of each sample (SFT-like
    prompts), so micro-batches carry different numbers of loss tokens.
    """

    def __init__(
        self, num_samples: int, seq_length: int, vocab_size: int, seed: int = 0, masked_prefix: bool = False
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab_size, (num_samples, seq_length + 1), generator=g)
        self.loss_mask = torch.ones(num_samples, seq_length)
        if masked_prefix:
            prefix = torch.randint(0, seq_length - 1, (num_samples,), generator=g)
            self.loss_mask[torch.arange(seq_length).unsqueeze(0) < prefix.unsqueeze(1)] = 0.0
        self.positions = torch.arange(seq_length)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.tokens[index]
        return {
            "tokens": row[:-1],
            "labels": row[1:],
            "loss_mask": self.loss_mask[index],
            "position_ids": self.positions,
        }
